"""Which failures mean "the store cannot do this right now" (answer 503, retry later) rather than a bug.

A PostgreSQL restart shows up in many forms: a refused or reset socket, ``57P01 admin_shutdown`` on a live
connection, ``57P03 cannot_connect_now`` while it starts, a pooled connection found closed. SQLAlchemy wraps
them in different classes, so the whole cause chain is examined. A transaction PostgreSQL aborted to break
a deadlock (``40P01``) or a serialization conflict (``40001``) is the same for a caller: nothing happened,
try again.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError

try:
    from asyncpg.exceptions import InterfaceError as PgInterfaceError
    from asyncpg.exceptions import InternalClientError as PgInternalClientError
    from asyncpg.exceptions import PostgresError as PgError
except ImportError:  # installed without mainspring[postgres]: no asyncpg error can happen
    PgInterfaceError = PgInternalClientError = PgError = ()  # type: ignore[assignment,misc]

# SQLSTATE class 08 (connection exception), 57P01-57P03 (shutdown, crash, starting up), 53300 (too many
# connections), 40001/40P01 (serialization failure, deadlock victim), 25006 (a write on a read-only server:
# after a failover a pooled connection can still reach the old primary, now a standby — the connection is
# dropped and the next one goes to the new primary): all pass by themselves.
_TRANSIENT_SQLSTATES = ("57P01", "57P02", "57P03", "53300", "40001", "40P01", "25006")


STORE_ERRORS: tuple[type[Exception], ...] = tuple(
    c for c in (DBAPIError, OSError, TimeoutError, PgError, PgInterfaceError, PgInternalClientError) if isinstance(c, type)
)
"""What the store raises when a statement or a connection fails (for handlers registered by class): through
SQLAlchemy, or straight from asyncpg where the store drives the connection itself (BEGIN, NOTIFY + COMMIT)."""


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the store is unreachable, restarting, or aborted the
    transaction for a retry."""
    return any(_says_unavailable(error) for error in _chain(exc))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what caused it: its cause, its context and the driver's error SQLAlchemy wraps, each once."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        pending.extend([error.__cause__, error.__context__, getattr(error, "orig", None)])


def _says_unavailable(error: BaseException) -> bool:
    if isinstance(error, OSError | TimeoutError | OperationalError | DisconnectionError):
        return True
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, PgInterfaceError) and "closed" in str(error):
        return True
    if isinstance(error, PgInternalClientError):
        # A connection cut mid-operation can be left in a state asyncpg cannot leave ("cannot switch to
        # state N; another operation is in progress"): the connection is lost, not the request wrong.
        return True
    sqlstate = getattr(error, "sqlstate", None)
    return isinstance(sqlstate, str) and (sqlstate.startswith("08") or sqlstate in _TRANSIENT_SQLSTATES)


_REFUSED_SQLSTATES = ("28000", "28P01", "3D000")
"""invalid_authorization_specification (no such role), invalid_password, invalid_catalog_name (no such database):
the database answered, and waiting will not change its answer."""


def refusal(exc: BaseException) -> str | None:
    """The database's own words when ``exc`` (or what caused it) is a refused connection, else None."""
    for error in _chain(exc):
        if getattr(error, "sqlstate", None) in _REFUSED_SQLSTATES:
            return str(error).strip().splitlines()[0]
    return None


class TransactionAborted(Exception):
    """A COMMIT found its transaction already aborted by a failed statement: nothing was committed."""


class UnusableConnection(Exception):
    """A connection handed to the store to write in its transaction is not one it can use (another database,
    another kind of connection, no transaction open). ``mainspring.producer`` raises it as ``ForeignConnection``."""
