"""The store: one object every face writes and reads through, whichever engine is behind it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Executable, Result
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from mainspring.store import postgres, sqlite
from mainspring.store.clock import Clock
from mainspring.store.dialect import Dialect
from mainspring.store.errors import is_unavailable
from mainspring.store.notify import Notifier, PostgresListener


def normalize_url(url: str) -> str:
    """``sqlite:///x.db`` and ``postgresql://…`` as users write them → the async drivers' URLs."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return str(parsed.set(drivername="sqlite+aiosqlite"))
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://…")


def plain_dsn(url: str) -> str:
    """A libpq-style DSN for raw asyncpg connections (the LISTEN connection)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass
class Transaction:
    """A write transaction: the connection plus what to do once it has committed."""

    conn: AsyncConnection
    store: Store
    channels: list[str] = field(default_factory=list)
    _after_commit: list[Callable[[], Any]] = field(default_factory=list)

    async def execute(self, statement: Executable, params: Any = None) -> Result[Any]:
        return await self.conn.execute(statement, params)

    def notify(self, channel: str) -> None:
        """Wake whoever waits on ``channel``, here and on other servers, once this commits."""
        if channel not in self.channels:
            self.channels.append(channel)

    def after_commit(self, callback: Callable[[], Any]) -> None:
        self._after_commit.append(callback)


class Store:
    """Engines, dialect, clock and wake-ups for one database.

    ``transaction()`` is the only way to write; on SQLite it also serializes writers in this process, so
    concurrent requests queue instead of failing with "database is locked".
    """

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        pool_size: int = 10,
        sqlite_synchronous: str = "FULL",
    ) -> None:
        self.url = normalize_url(url)
        self.clock = clock or Clock()
        self.notifier = Notifier()
        self.clock.subscribe(self.notifier.signal_all)
        self._listener: PostgresListener | None = None
        parsed = make_url(self.url)
        self.dialect: Dialect
        if parsed.get_backend_name() == "sqlite":
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            self.dialect = sqlite.SqliteDialect()
            self.writer, self.reader = sqlite.create_engines(self.url, sqlite_synchronous, readers=4)
            self._write_lock: asyncio.Lock | None = asyncio.Lock()
        else:
            self.dialect = postgres.PostgresDialect()
            self.writer = self.reader = postgres.create_engine(self.url, pool_size)
            self._write_lock = None

    @property
    def is_postgres(self) -> bool:
        return self.dialect.name == "postgresql"

    @property
    def engine(self) -> AsyncEngine:
        return self.writer

    def now_ms(self) -> int:
        return self.clock.now_ms()

    async def start(self) -> None:
        """Begin listening for other servers' wake-ups (PostgreSQL only)."""
        if self.is_postgres and self._listener is None:
            self._listener = PostgresListener(plain_dsn(self.url), self.notifier)
            self._listener.start()

    async def listening(self, timeout_s: float = 10) -> None:
        """Wait until wake-ups from other servers arrive (PostgreSQL's LISTEN is connected)."""
        if self._listener is not None:
            await asyncio.wait_for(self._listener.connected.wait(), timeout_s)

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        await self.writer.dispose()
        if self.reader is not self.writer:
            await self.reader.dispose()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        lock = self._write_lock
        if lock is not None:
            await lock.acquire()
        try:
            async with self.writer.connect() as conn, _discarded_if_lost(conn):
                async with conn.begin():
                    tx = Transaction(conn, self)
                    yield tx
                    if tx.channels:
                        await self.dialect.notify(conn, tx.channels)
        finally:
            if lock is not None:
                lock.release()
        self.notifier.signal_many(tx.channels)
        for callback in tx._after_commit:
            callback()

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A read-only snapshot (one transaction) for queries that need no lock."""
        async with self.reader.connect() as conn, _discarded_if_lost(conn):
            async with conn.begin():
                yield conn


@contextlib.asynccontextmanager
async def _discarded_if_lost(conn: AsyncConnection) -> AsyncIterator[None]:
    """Never give the pool back a connection that failed as lost: asyncpg can leave one cut mid-operation
    in a state every later use fails on, and the pool's pre-ping does not recognise it."""
    try:
        yield
    except BaseException as exc:
        if conn.dialect.name == "postgresql" and is_unavailable(exc) and not conn.invalidated:
            with contextlib.suppress(Exception):
                await conn.invalidate()
        raise
