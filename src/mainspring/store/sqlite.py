"""SQLite: one file, WAL, one writer at a time."""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import Select, Table, event
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool


class SqliteDialect:
    name = "sqlite"

    def insert(self, table: Table) -> Any:
        return sqlite_insert(table)

    def skip_locked(self, query: Select[Any]) -> Select[Any]:
        return query

    def for_update(self, query: Select[Any]) -> Select[Any]:
        return query

    async def advisory_xact_lock(self, conn: AsyncConnection, key: str) -> None:
        return None

    async def try_advisory_xact_lock(self, conn: AsyncConnection, key: str) -> bool:
        return True

    async def notify(self, conn: AsyncConnection, channels: list[str]) -> None:
        return None

    def is_unique_violation(self, exc: BaseException) -> bool:
        orig = getattr(exc, "orig", exc)
        return isinstance(orig, sqlite3.IntegrityError) and "UNIQUE" in str(orig)

    def is_connection_error(self, exc: BaseException) -> bool:
        return False


def create_engines(url: str, synchronous: str, readers: int) -> tuple[AsyncEngine, AsyncEngine]:
    """A one-connection writer engine (``BEGIN IMMEDIATE``) and a small reader pool (``BEGIN``).

    Writes take the database lock when they begin rather than when they first write, so a transaction
    never fails half-way with "database is locked"; another process's writer makes it wait (busy timeout).
    """

    def build(begin: str, pool_size: int) -> AsyncEngine:
        engine = create_async_engine(
            url, poolclass=AsyncAdaptedQueuePool, pool_size=pool_size, max_overflow=0, pool_timeout=300
        )

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql(begin)

        return engine

    return build("BEGIN IMMEDIATE", 1), build("BEGIN", readers)
