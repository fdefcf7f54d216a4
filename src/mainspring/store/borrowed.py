"""Writing in the caller's own transaction (API.md §6): the store's statements run on a connection the
application opened — an asyncpg ``Connection``, a psycopg 3 ``AsyncConnection``, a SQLAlchemy
``AsyncConnection`` or ``AsyncSession`` — inside the transaction it has open, which it commits or rolls back
itself.

A raw driver connection is driven through SQLAlchemy by a dialect that borrows it: it never begins, commits,
rolls back or closes it, and leaves its settings as they were (SQLAlchemy's asyncpg dialect installs JSON codecs
on every connection it opens — the application's own queries would then get ``dict`` where they got ``str``).
Events go to ``events_at_commit`` and are numbered when the caller commits (migration interactions_0017), and the
wake-ups are NOTIFYs sent in the caller's transaction, so PostgreSQL delivers them at its commit — or never.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from typing import Any, Protocol, cast

from sqlalchemy import JSON, Executable, Result, text
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.dialects.postgresql.psycopg import PGDialectAsync_psycopg
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.pool import NullPool

from mainspring.store.dialect import Executor
from mainspring.store.errors import UnusableConnection
from mainspring.store.notify import PG_CHANNEL, payloads
from mainspring.store.types import ExecuteParams


class _TextJSONB(JSONB):
    """JSONB read as asyncpg answers it without SQLAlchemy's codecs: the JSON text."""

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[str | bytes | None], Any]:
        return lambda value: None if value is None else json.loads(value)


class _Borrowing:
    """Never ends the application's transaction nor closes its connection: those are the application's."""

    def do_rollback(self, dbapi_connection: DBAPIConnection) -> None:
        pass

    def do_commit(self, dbapi_connection: DBAPIConnection) -> None:
        pass

    def do_close(self, dbapi_connection: DBAPIConnection) -> None:
        pass

    def do_terminate(self, dbapi_connection: DBAPIConnection) -> None:
        pass

    def reset_isolation_level(self, dbapi_connection: DBAPIConnection) -> None:
        pass

    def get_isolation_level(self, dbapi_connection: DBAPIConnection) -> str:
        # psycopg's dialect ends an idle transaction to read it; the level is the application's anyway.
        return "READ COMMITTED"


class BorrowedAsyncpg(_Borrowing, PGDialect_asyncpg):  # type: ignore[misc]
    supports_statement_cache = True  # read from the class itself
    colspecs = {**PGDialect_asyncpg.colspecs, JSONB: _TextJSONB, JSON: _TextJSONB}

    async def setup_asyncpg_json_codec(self, conn: object) -> None:
        pass

    async def setup_asyncpg_jsonb_codec(self, conn: object) -> None:
        pass


class BorrowedPsycopg(_Borrowing, PGDialectAsync_psycopg):  # type: ignore[misc]
    supports_statement_cache = True

    @classmethod
    def get_async_dialect_cls(cls, url: URL) -> type[Dialect]:
        return cls  # psycopg's would answer its own async dialect, not this one


registry.register("postgresql.mainspring_borrowed_asyncpg", __name__, "BorrowedAsyncpg")
registry.register("postgresql.mainspring_borrowed_psycopg", __name__, "BorrowedPsycopg")


def _driver_of(connection: object) -> str | None:
    module = type(connection).__module__
    if module.startswith("asyncpg"):
        return "asyncpg"
    if module.startswith("psycopg") and hasattr(connection, "cursor"):
        return "psycopg"
    return None


class _InTransaction(Protocol):
    """What is asked of an asyncpg connection before writing through it."""

    def is_in_transaction(self) -> bool: ...


@contextlib.asynccontextmanager
async def sqlalchemy_connection(connection: object) -> AsyncIterator[AsyncConnection]:
    """``connection`` as a SQLAlchemy ``AsyncConnection`` in the transaction it has open."""
    if isinstance(connection, AsyncSession):
        connection = await connection.connection()
    if isinstance(connection, AsyncConnection):
        if connection.dialect.name != "postgresql":
            raise UnusableConnection(f"the connection is to {connection.dialect.name}, not to the store's PostgreSQL database")
        yield connection
        return
    driver = _driver_of(connection)
    if driver is None:
        raise UnusableConnection(
            f"a {type(connection).__module__}.{type(connection).__qualname__} is not a connection Mainspring can write through "
            "(an asyncpg Connection, a psycopg AsyncConnection, a SQLAlchemy AsyncConnection or AsyncSession)"
        )
    if driver == "asyncpg" and not cast(_InTransaction, connection).is_in_transaction():
        raise UnusableConnection("the asyncpg connection has no transaction open: start one (async with conn.transaction())")

    token = _LENT.set(connection)
    try:
        async with _engine(driver).connect() as borrowed_connection:
            yield borrowed_connection
    finally:
        _LENT.reset(token)


_LENT: ContextVar[object] = ContextVar("mainspring_lent_connection")
"""The application's connection the engine of its driver wraps at this moment (one per call)."""
_ENGINES: dict[str, AsyncEngine] = {}


def _engine(driver: str) -> AsyncEngine:
    """One engine per driver for the process: it wraps the connection lent for the call (``_LENT``) at each
    checkout and lets it go at checkin (``NullPool``, whose close is the dialect's no-op), so it keeps none, and
    the dialect reads the server's version once instead of at every call."""
    engine = _ENGINES.get(driver)
    if engine is None:
        async def lent() -> object:
            return _LENT.get()

        engine = _ENGINES[driver] = create_async_engine(f"postgresql+mainspring_borrowed_{driver}://", async_creator=lent,
                                                        poolclass=NullPool)
    return engine


class BorrowedSession:
    """The store's ``Session`` on the application's connection: statements only, never BEGIN or COMMIT."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection

    async def execute(self, statement: Executable, params: ExecuteParams = None) -> Result[Any]:
        return await self.connection.execute(statement, params)


_IDENTITY = text("SELECT current_database() AS db, pg_postmaster_start_time()::text AS started, "
                 "(SELECT to_regclass('events_at_commit') IS NOT NULL) AS ready")
_NOTIFY = text("SELECT pg_notify(:channel, payload) FROM unnest(CAST(:payloads AS text[])) AS payload")


async def identity(session: Executor) -> tuple[str, str, bool]:
    """What names a database: its name and its server's start (two servers never started at the same
    microsecond), and whether its schema takes writes in a caller's transaction."""
    row = (await session.execute(_IDENTITY)).one()
    return str(row.db), str(row.started), bool(row.ready)


async def notify(session: BorrowedSession, channels: list[str]) -> None:
    """The wake-ups, sent in the caller's transaction: PostgreSQL delivers them when it commits."""
    if channels:
        await session.execute(_NOTIFY, {"channel": PG_CHANNEL, "payloads": payloads(channels)})


async def savepoint(session: BorrowedSession) -> None:
    await session.execute(text("SAVEPOINT mainspring_write"))


async def back_to_savepoint(session: BorrowedSession) -> None:
    """Undo what was written since ``savepoint``, so the caller's transaction goes on as it was (a failed
    statement would otherwise have aborted all of it)."""
    with contextlib.suppress(Exception):
        await session.execute(text("ROLLBACK TO SAVEPOINT mainspring_write"))


async def release_savepoint(session: BorrowedSession) -> None:
    await session.execute(text("RELEASE SAVEPOINT mainspring_write"))


__all__ = ["BorrowedSession", "UnusableConnection", "identity", "notify", "sqlalchemy_connection"]
