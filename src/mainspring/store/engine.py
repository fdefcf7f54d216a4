"""The store: one object every face writes and reads through, whichever engine is behind it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Executable, Result, TextClause, TextualSelect, literal, select
from sqlalchemy.engine import make_url

from mainspring.store import borrowed
from mainspring.store.clock import Clock
from mainspring.store.dialect import Backend, Session
from mainspring.store.errors import UnusableConnection
from mainspring.store.group import GroupCommit, GroupRead
from mainspring.store.notify import Notifier, PostgresListener
from mainspring.store.types import ExecuteParams, Params
from mainspring.store.urls import normalize_url, plain_dsn
from mainspring.store.wakeups import UnixWakeups

if TYPE_CHECKING:
    import asyncpg

    from mainspring.store.postgres import RawResult

T = TypeVar("T")
ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

GROUP_READS_PARALLEL = 2
"""Group reads a store runs at once: a read arriving while one group is read need not wait for it to end."""

GROUP_COMMITS_PARALLEL = 4
"""Shared transactions of many-statement writes a PostgreSQL store runs at once (of its pool's connections):
measured, four beat one for batching submits (+8–19 %), while joined writes (creates, puts) do best in one."""

LISTEN_APPLICATION_NAME = "mainspring-listen"
"""How the LISTEN connection shows in ``pg_stat_activity``."""


class Transaction:
    """A write transaction: its statements, the wake-ups it sends and what runs once it has committed."""

    __slots__ = ("_after_commit", "_before_last", "_last", "alone", "channels", "events_at_commit", "session", "shared",
                 "statements", "store")

    def __init__(self, session: Session, store: Store, alone: bool = False, shared: bool = False, events_at_commit: bool = False) -> None:
        self.session = session
        self.store = store
        self.events_at_commit = events_at_commit
        """The caller's own transaction (``Store.borrowed_transaction``): its events are staged and numbered when
        the caller commits, never holding the numbering lock while the caller's transaction stays open."""
        self.alone = alone
        """The transaction's only writer (group commit says so): it may run its one statement alone."""
        self.shared = shared
        """Other writes share this transaction (group commit): a write that would wait for a lock while they
        hold theirs should rather fail, and be run again alone (two groups waiting on each other deadlock)."""
        self.statements = 0
        self.channels: list[str] = []
        self._after_commit: list[Callable[[], object]] = []
        self._last: dict[Hashable, tuple[Callable[[Transaction, list[Any]], Awaitable[object]], list[Any]]] = {}
        self._before_last: dict[Hashable, tuple[Callable[[Transaction, list[Any]], Awaitable[object]], list[Any]]] = {}

    async def execute(self, statement: Executable, params: ExecuteParams = None) -> Result[Any]:
        self.statements += 1
        return await self.session.execute(statement, params)

    @property
    def committed_alone(self) -> bool:
        """Its one statement ran alone and has committed (PostgreSQL): later reads go through ``store.read``."""
        return bool(getattr(self.session, "done_alone", False))

    @property
    def may_run_alone(self) -> bool:
        """Whether the next statement may be the whole transaction (``execute_alone``): not once something waits
        to be written last (it would come after that statement's commit)."""
        return self.alone and self.statements == 0 and not self._last and not self._before_last

    async def execute_alone(self, statement: Executable, params: ExecuteParams = None) -> Result[Any]:
        """Run ``statement`` as the whole transaction (only when ``may_run_alone``): on PostgreSQL it commits
        by itself in one round trip, so it must send its own wake-ups to other servers (``pg_notify`` inside
        it); ``notify`` still wakes this server. Nothing may be executed after it."""
        if not self.may_run_alone:
            raise RuntimeError("execute_alone needs a transaction of one writer, before any statement")
        self.statements += 1
        return await self.session.execute_alone(statement, params)  # type: ignore[attr-defined, no-any-return]

    async def fetch_prepared(self, sql: str, *args: object) -> list[asyncpg.Record]:
        """PostgreSQL only: run ``sql`` (``$1``… parameters) in this transaction on the raw asyncpg connection,
        prepared once per connection, answering its records. For the hottest statements, where SQLAlchemy's
        per-call work (cache key, compiled-cache lookup, parameter processing, result wrapping) costs more
        than PostgreSQL running them."""
        self.statements += 1
        return await self.session.fetch_prepared(sql, args)  # type: ignore[attr-defined, no-any-return]

    async def fetch_prepared_alone(self, sql: str, *args: object) -> list[asyncpg.Record]:
        """``fetch_prepared`` as the whole transaction (only when ``may_run_alone``; see ``execute_alone``)."""
        if not self.may_run_alone:
            raise RuntimeError("execute_alone needs a transaction of one writer, before any statement")
        self.statements += 1
        return await self.session.fetch_prepared_alone(sql, args)  # type: ignore[attr-defined, no-any-return]

    async def fetch(self, statement: TextClause | TextualSelect, params: Params) -> Result[*tuple[Any, ...]] | RawResult:
        """``execute`` of a plain textual statement (named parameters, none typed) on a hot path: on PostgreSQL
        ``fetch_prepared`` of it compiled once, its rows read as SQLAlchemy's are (``all()``, attributes,
        slices); elsewhere ``execute``."""
        fetch = getattr(self.session, "fetch_text", None)
        if fetch is None:
            return await self.execute(statement, params)
        self.statements += 1
        return await fetch(statement, params)

    async def fetch_alone(self, statement: TextClause | TextualSelect, params: Params) -> Result[*tuple[Any, ...]] | RawResult:
        """``execute_alone`` of a plain textual statement (named parameters, none typed) on a hot path: on
        PostgreSQL ``fetch_prepared_alone`` of it compiled once, its rows read as SQLAlchemy's are (``all()``,
        attributes, slices); elsewhere ``execute_alone``."""
        fetch = getattr(self.session, "fetch_alone", None)
        if fetch is None:
            return await self.execute_alone(statement, params)
        if not self.may_run_alone:
            raise RuntimeError("execute_alone needs a transaction of one writer, before any statement")
        self.statements += 1
        return await fetch(statement, params)

    def notify(self, channel: str) -> None:
        """Wake whoever waits on ``channel``, here and on other servers, once this commits."""
        if channel not in self.channels:
            self.channels.append(channel)

    def after_commit(self, callback: Callable[[], object]) -> None:
        self._after_commit.append(callback)

    def write_last(self, key: Hashable, write_all: Callable[[Transaction, list[ItemT]], Awaitable[object]], item: ItemT) -> None:
        """Write ``item`` as the transaction's last statement before it commits, in one call
        ``write_all(tx, items)`` with the other items of ``key`` given to it. For what takes a lock every writer
        needs (the events' numbering lock): taken last, it is held for the commit only and never while this
        transaction waits for another."""
        entry = self._last.get(key)
        if entry is None:
            self._last[key] = (write_all, [item])
        else:
            entry[1].append(item)

    def write_before_last(self, key: Hashable, write_all: Callable[[Transaction, list[ItemT]], Awaitable[object]], item: ItemT) -> None:
        """Like ``write_last``, but before every ``write_last`` write: for what takes row locks of its own (a
        notification locks its machine), which must never be waited for while the events' numbering lock is held."""
        entry = self._before_last.get(key)
        if entry is None:
            self._before_last[key] = (write_all, [item])
        else:
            entry[1].append(item)

    async def _write_last(self) -> None:
        while self._before_last:
            key = next(iter(self._before_last))
            write_all, items = self._before_last.pop(key)
            await write_all(self, items)
        while self._last:
            if self.committed_alone:
                raise RuntimeError("writes left for the end of a transaction whose one statement has committed")
            key = next(iter(self._last))
            write_all, items = self._last.pop(key)
            await write_all(self, items)


class Store:
    """Engine, clock and wake-ups for one database.

    ``transaction()`` is the only way to write; ``grouped(work)`` writes too, sharing one commit with the
    writes that arrive at the same moment, and ``grouped_batch`` shares one statement with the writes of its
    kind among them. ``read()`` is a read-only view.
    """

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        pool_size: int = 10,
        sqlite_synchronous: str = "FULL",
        generic_plans: bool = False,
    ) -> None:
        from mainspring.store import postgres, sqlite

        self.url = normalize_url(url)
        self.clock = clock or Clock()
        self.notifier = Notifier()
        self.clock.subscribe(self.notifier.signal_all)
        self._listener: PostgresListener | None = None
        self._wakeups: UnixWakeups | None = None
        self.backend: Backend
        parsed = make_url(self.url)
        if parsed.get_backend_name() == "sqlite":
            self.backend = sqlite.SqliteBackend(self.url, sqlite_synchronous)
            if parsed.database and parsed.database != ":memory:":
                self._wakeups = UnixWakeups(parsed.database, self.notifier)
        else:
            self.backend = postgres.PostgresBackend(self.url, pool_size, generic_plans)
        self.group_commit = GroupCommit(self, parallel=GROUP_COMMITS_PARALLEL if self.is_postgres else 1)
        # Writes joined into one statement batch best in one transaction at a time; on SQLite (one writer)
        # every group shares one lane.
        self.joined_commit = GroupCommit(self) if self.is_postgres else self.group_commit
        self.group_read = GroupRead(self, parallel=GROUP_READS_PARALLEL)
        self.extras: dict[str, Any] = {}
        """Per-store caches of the faces (settings seen, names known to exist)."""

    @property
    def dialect(self) -> Backend:
        return self.backend

    @property
    def is_postgres(self) -> bool:
        return self.backend.name == "postgresql"

    def now_ms(self) -> int:
        return self.clock.now_ms()

    async def start(self) -> None:
        """Begin listening for other processes' wake-ups: LISTEN on PostgreSQL, a Unix socket beside SQLite."""
        if self.is_postgres and self._listener is None:
            self._listener = PostgresListener(plain_dsn(self.url, LISTEN_APPLICATION_NAME), self.notifier)
            self._listener.start()
        if self._wakeups is not None:
            await self._wakeups.start()

    async def listening(self, timeout_s: float = 10) -> None:
        """Wait until wake-ups from other servers arrive (PostgreSQL's LISTEN is connected)."""
        if self._listener is not None:
            await asyncio.wait_for(self._listener.connected.wait(), timeout_s)

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        if self._wakeups is not None:
            await self._wakeups.stop()
        await self.backend.close()

    @contextlib.asynccontextmanager
    async def transaction(self, *, alone: bool = False, shared: bool = False) -> AsyncIterator[Transaction]:
        """A write transaction. ``alone``: its one writer may run a single statement as the whole of it;
        ``shared``: several writes share it (see ``Transaction.shared``)."""
        async with self.backend.transaction(lazy=alone) as session:
            tx = Transaction(session, self, alone, shared)
            yield tx
            await tx._write_last()
            await self.backend.commit(session, tx.channels)
        self.notifier.signal_many(tx.channels)
        if self._wakeups is not None and tx.channels:
            self._wakeups.send(tx.channels)
        for callback in tx._after_commit:
            callback()

    async def grouped(self, work: Callable[[Transaction], Awaitable[T]]) -> T:
        """Run ``work(tx)`` in a transaction shared with the writes that arrive while the previous one
        commits; answers what ``work`` answered, once it has committed."""
        return await self.group_commit.run(work)

    async def grouped_batch(self, key: Hashable, write_all: Callable[[Transaction, list[ItemT]], Awaitable[Sequence[ResultT | BaseException]]], item: ItemT) -> ResultT:
        """Write ``item`` in a shared transaction (as ``grouped``), and in one call ``write_all(tx, items)`` with
        the other items of ``key`` that arrived at the same moment; answers ``item``'s result, once committed."""
        return await self.joined_commit.run_joined(key, write_all, item)

    async def read_batched(self, key: Hashable, read_all: Callable[[Session, list[ItemT]], Awaitable[Sequence[ResultT | BaseException]]], item: ItemT) -> ResultT:
        """Read ``item`` in one call ``read_all(session, items)`` with the other reads of ``key`` that arrive while
        the previous group is read; answers ``item``'s result."""
        return await self.group_read.run_joined(key, read_all, item)  # type: ignore[arg-type]

    @contextlib.asynccontextmanager
    async def borrowed_transaction(self, connection: object) -> AsyncIterator[Transaction]:
        """Write in the transaction the caller has open on ``connection`` (PostgreSQL; see ``store.borrowed``):
        nothing is committed here, the events are numbered and the wake-ups sent by the caller's commit, and
        a rollback leaves nothing. A failure leaves the caller's transaction as it was (a savepoint). What
        waits for a commit (``after_commit``) is dropped: the commit is not seen here."""
        if not self.is_postgres:
            raise UnusableConnection("only a PostgreSQL store writes in the caller's transaction")
        async with borrowed.sqlalchemy_connection(connection) as conn:
            session = borrowed.BorrowedSession(conn)
            name, started, ready = await borrowed.identity(session)
            if (name, started) != await self._identity(refresh=False) and (name, started) != await self._identity(refresh=True):
                raise UnusableConnection(f"the connection is to database {name!r}, not to the store's {self.extras['identity'][0]!r}")
            if not ready:
                raise UnusableConnection("the store's database is not migrated for writes in the caller's transaction")
            await borrowed.savepoint(session)
            try:
                tx = Transaction(session, self, events_at_commit=True)
                yield tx
                await tx._write_last()
                await borrowed.notify(session, tx.channels)
            except BaseException:
                await borrowed.back_to_savepoint(session)
                raise
            await borrowed.release_savepoint(session)

    async def _identity(self, *, refresh: bool) -> tuple[str, str]:
        if refresh or "identity" not in self.extras:
            async with self.read() as session:
                name, started, _ = await borrowed.identity(session)
            self.extras["identity"] = (name, started)
        return self.extras["identity"]  # type: ignore[no-any-return]

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[Session]:
        """A read-only view: a snapshot on SQLite; each statement its own snapshot on PostgreSQL."""
        async with self.backend.read() as session:
            yield session

    async def ping(self) -> None:
        """One round trip to the store (readiness)."""
        async with self.read() as session:
            await session.execute(select(literal(1)))

    async def run_sync(self, work: Callable[[Connection], T]) -> T:
        """Run synchronous SQLAlchemy code (migrations, DDL) in one transaction."""
        return await self.backend.run_sync(work)
