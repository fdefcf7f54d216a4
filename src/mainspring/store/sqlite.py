"""SQLite: one file, WAL, one writer at a time, statements run on the event loop.

A statement on a local SQLite file takes microseconds; handing each one to a thread (as aiosqlite does) costs
far more than running it, and under load each hand-back waits for the GIL. So statements run synchronously on
the event loop, and only what can block for long leaves it:

- taking the write lock: ``BEGIN IMMEDIATE`` with no busy timeout, retried with ``asyncio.sleep`` while
  another process writes, so the loop never blocks on another process;
- the commit (the fsync): one hop to a dedicated thread, shared by every request of a group commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple

from sqlalchemy import ColumnElement, Connection, Executable, Result, Select, Table, create_engine, event
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import QueuePool

from mainspring.store.types import ExecuteParams

if TYPE_CHECKING:
    from mainspring.store.dialect import Executor

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

BUSY_WAIT_MS = 30_000
"""How long a writer waits for another process's write lock before the request fails (503)."""


class SqliteSession:
    """The one writer connection inside a transaction, or a reader connection inside a snapshot."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def execute(self, statement: Executable, params: ExecuteParams = None) -> Result[Any]:
        return self.conn.execute(statement, params)

    async def execute_alone(self, statement: Executable, params: ExecuteParams = None) -> Result[Any]:
        """SQLite's transaction is already open (one writer): the statement is simply part of it."""
        return self.conn.execute(statement, params)


class SqliteBackend:
    name = "sqlite"
    one_statement_writes = events_numbered_last = parallel_reads = counts_per_connection = False
    writes_in_callers_transactions = False

    def __init__(self, url: str, synchronous: str = "FULL") -> None:
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        self.engine = create_engine(
            make_url(url).set(drivername="sqlite+pysqlite"),
            poolclass=QueuePool,
            pool_size=5,
            max_overflow=-1,  # a checkout must never wait: it would block the event loop
            connect_args={"check_same_thread": False, "isolation_level": None},
        )

        @event.listens_for(self.engine, "connect")
        def _on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            # Readers in WAL mode wait only while a crashed writer's WAL is recovered.
            cursor.execute("PRAGMA busy_timeout=2000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        self.round_trips = 0
        """Statements run (SQLite has no round trips; the count still shows a hot path growing)."""

        @event.listens_for(self.engine, "before_cursor_execute")
        def _count(*_args: object) -> None:
            self.round_trips += 1

        self._writer: Connection | None = None
        self._write_lock = asyncio.Lock()
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-commit")

    # --- what differs in SQL --------------------------------------------------------------------------

    def insert(self, table: Table) -> SqliteInsert:
        return sqlite_insert(table)

    def skip_locked(self, query: Select[*Ts]) -> Select[*Ts]:
        return query

    def for_update(self, query: Select[*Ts]) -> Select[*Ts]:
        return query

    def any_of(self, column: ColumnElement[T], values: Iterable[T]) -> ColumnElement[bool]:
        return column.in_(list(values))

    def for_share(self, query: Select[*Ts]) -> Select[*Ts]:
        return query

    async def advisory_xact_lock(self, session: Executor, key: str) -> None:
        return None

    async def try_advisory_xact_lock(self, session: Executor, key: str) -> bool:
        return True

    def session_lock(self, key: str) -> contextlib.AbstractAsyncContextManager[SqliteSession | None]:
        raise NotImplementedError("SQLite has one writer: nothing needs a lock held across transactions")

    def is_unique_violation(self, exc: BaseException) -> bool:
        orig = getattr(exc, "orig", exc)
        return isinstance(orig, sqlite3.IntegrityError) and "UNIQUE" in str(orig)

    def is_connection_error(self, exc: BaseException) -> bool:
        return False

    # --- transactions ---------------------------------------------------------------------------------

    def _writer_connection(self) -> Connection:
        if self._writer is None or self._writer.closed or self._writer.invalidated:
            conn = self.engine.connect()
            # The write lock is waited for in ``_begin_immediate``, off the event loop's back.
            conn.exec_driver_sql("PRAGMA busy_timeout=0")
            conn.commit()
            self._writer = conn
        return self._writer

    async def _begin_immediate(self, conn: Connection) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BUSY_WAIT_MS / 1000
        pause = 0.0005
        while True:
            try:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                return
            except OperationalError as exc:
                conn.rollback()
                if not _is_busy(exc) or loop.time() > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.02)

    @contextlib.asynccontextmanager
    async def transaction(self, lazy: bool = False) -> AsyncIterator[SqliteSession]:
        """The writer, under this process's write lock and SQLite's; committed by ``commit``."""
        async with self._write_lock:
            conn = self._writer_connection()
            await self._begin_immediate(conn)
            session = SqliteSession(conn)
            try:
                yield session
            except BaseException:
                _rollback_quietly(conn)
                raise

    async def commit(self, session: SqliteSession, channels: list[str]) -> None:
        """Commit in the commit thread; the write lock is held until it has finished either way."""
        conn = session.conn
        self.round_trips += 1
        future = asyncio.get_running_loop().run_in_executor(self._committer, conn.commit)
        try:
            await _uncancellable(future)
        except BaseException:
            _rollback_quietly(conn)
            raise

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[SqliteSession]:
        """A snapshot on a reader connection: the reads inside see one state of the database."""
        conn = self.engine.connect()
        try:
            conn.exec_driver_sql("BEGIN")
            yield SqliteSession(conn)
        finally:
            _rollback_quietly(conn)
            conn.close()

    async def run_sync(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` on the writer in one transaction (migrations, DDL)."""
        async with self.transaction() as session:
            result = work(session.conn)
            await self.commit(session, [])
        return result

    async def close(self) -> None:
        async with self._write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        self.engine.dispose()
        self._committer.shutdown(wait=False)


def _is_busy(exc: OperationalError) -> bool:
    return isinstance(exc.orig, sqlite3.OperationalError) and "locked" in str(exc.orig)


def _rollback_quietly(conn: Connection) -> None:
    with contextlib.suppress(Exception):
        conn.rollback()


async def _uncancellable(future: asyncio.Future[T]) -> T:
    """Await ``future`` to its end even if the waiter is cancelled meanwhile (then re-raise the cancel):
    the writer connection must not be handed on while its commit still runs in the thread."""
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(future)
        except asyncio.CancelledError:
            if future.done():
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError()
        return result
