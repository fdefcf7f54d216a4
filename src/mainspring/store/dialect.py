"""What differs between the engines, behind one small interface.

Every query is written once in SQLAlchemy Core; only the few things below have an engine-specific form, and
each engine drives its own transactions (see ``sqlite`` and ``postgres``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeAlias, TypeVar, TypeVarTuple

from sqlalchemy import CTE, ColumnElement, Connection, Executable, Result, Select, Table
from sqlalchemy.dialects.postgresql import Insert as PostgresInsert
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert

from mainspring.store.types import ExecuteParams

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

Upsert: TypeAlias = PostgresInsert | SqliteInsert
"""An INSERT with ``on_conflict_do_nothing`` / ``on_conflict_do_update``: each engine's own, same calls."""


class Session(Protocol):
    """Runs statements on one connection: inside a transaction, or a read-only view."""

    async def execute(self, statement: Executable, params: ExecuteParams = None) -> Result[Any]: ...


class Executor(Protocol):
    async def execute(self, statement: Executable, params: ExecuteParams = None) -> Result[Any]: ...


class Backend(Protocol):
    name: str
    round_trips: int

    # What the engine can do, asked by name where the faces choose a path (never by the engine's name).
    one_statement_writes: bool
    """Rows, their events and their wake-ups written in one statement (data-modifying CTEs over arrays):
    PostgreSQL, where each statement is a round trip; SQLite, with none to save, writes a statement each."""
    events_numbered_last: bool
    """A transaction's events are written and numbered as its last statement (PostgreSQL: numbered in commit
    order by the sequencer); SQLite's one writer numbers them as they are inserted."""
    parallel_reads: bool
    """Reads side by side, each on a connection of its own, take the slowest one's time, not the sum (PostgreSQL);
    SQLite's one file gains nothing."""
    counts_per_connection: bool
    """Kept counts are added to rows of each connection's own, and the rows of connections gone are folded
    together later (``store.counts.fold``, PostgreSQL); SQLite's one writer keeps one row per count."""
    writes_in_callers_transactions: bool
    """A create may join a transaction the caller opened on a connection of its own (API.md §6: PostgreSQL);
    SQLite's one writer has no such connection to share."""

    def insert(self, table: Table) -> Upsert:
        """An INSERT that supports ``on_conflict_do_nothing`` / ``on_conflict_do_update``."""

    def skip_locked(self, query: Select[*Ts]) -> Select[*Ts]:
        """Rows no other transaction holds (PostgreSQL); SQLite has one writer, so all rows."""

    def for_update(self, query: Select[*Ts]) -> Select[*Ts]:
        """Lock the rows read until commit (PostgreSQL); a no-op under SQLite's single writer."""

    def any_of(self, column: ColumnElement[T], values: Iterable[T]) -> ColumnElement[bool]:
        """``column IN values``, bound as one array on PostgreSQL."""

    def for_share(self, query: Select[*Ts]) -> Select[*Ts]:
        """Lock the rows read against writers (and ``for_update``) until commit, not against other sharers."""

    async def advisory_xact_lock(self, session: Executor, key: str) -> None:
        """Serialize transactions on ``key`` until commit."""

    async def try_advisory_xact_lock(self, session: Executor, key: str) -> bool:
        """Like ``advisory_xact_lock`` but answers False at once if another transaction holds it."""

    def session_lock(self, key: str) -> contextlib.AbstractAsyncContextManager[Session | None]:
        """Hold ``key`` across transactions on a connection of its own, yielding that connection (for
        autocommit statements) or None if another session holds it (PostgreSQL only)."""

    def is_unique_violation(self, exc: BaseException) -> bool: ...

    def is_connection_error(self, exc: BaseException) -> bool: ...

    def transaction(self, lazy: bool = False) -> contextlib.AbstractAsyncContextManager[Session]:
        """Begin a write transaction; the caller ends it with ``commit`` (leaving by an error rolls back).
        ``lazy``: PostgreSQL sends BEGIN with the first statement, or none if that statement is run alone."""

    async def commit(self, session: Any, channels: list[str]) -> None:
        """Commit, sending the wake-ups on ``channels`` to other servers (PostgreSQL) with it."""

    def read(self) -> contextlib.AbstractAsyncContextManager[Session]: ...

    async def run_sync(self, work: Callable[[Connection], T]) -> T: ...

    async def close(self) -> None: ...


def picked_once(backend: Backend, query: Select[*Ts], name: str) -> CTE:
    """``query``'s rows, locked as ``skip_locked`` does, as a CTE computed once (``MATERIALIZED``), for an
    UPDATE to take: ``UPDATE … WHERE id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)`` may run its subquery
    again for each row it visits (a plan PostgreSQL can choose, a prepared statement's generic plan among
    them), and each run skips the rows the runs before it took: the UPDATE then takes far more than ``n``."""
    return backend.skip_locked(query).cte(name).prefix_with("MATERIALIZED")
