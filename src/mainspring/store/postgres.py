"""PostgreSQL: pooled connections, SKIP LOCKED, advisory locks, NOTIFY."""

from __future__ import annotations

import zlib
from typing import Any

from sqlalchemy import Select, Table, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from mainspring.store.notify import PG_CHANNEL

UNIQUE_VIOLATION = "23505"


def lock_key(key: str) -> int:
    """A stable signed 32-bit key for pg_advisory_*; collisions only serialize a little more."""
    value = zlib.crc32(key.encode())
    return value - (1 << 32) if value >= (1 << 31) else value


class PostgresDialect:
    name = "postgresql"

    def insert(self, table: Table) -> Any:
        return pg_insert(table)

    def skip_locked(self, query: Select[Any]) -> Select[Any]:
        return query.with_for_update(skip_locked=True)

    def for_update(self, query: Select[Any]) -> Select[Any]:
        return query.with_for_update()

    async def advisory_xact_lock(self, conn: AsyncConnection, key: str) -> None:
        await conn.execute(select(func.pg_advisory_xact_lock(lock_key(key))))

    async def try_advisory_xact_lock(self, conn: AsyncConnection, key: str) -> bool:
        return bool((await conn.execute(select(func.pg_try_advisory_xact_lock(lock_key(key))))).scalar())

    async def notify(self, conn: AsyncConnection, channels: list[str]) -> None:
        for channel in channels:
            await conn.execute(select(func.pg_notify(PG_CHANNEL, channel)))

    def is_unique_violation(self, exc: BaseException) -> bool:
        orig = getattr(exc, "orig", exc)
        return getattr(orig, "sqlstate", None) == UNIQUE_VIOLATION or getattr(
            getattr(orig, "__cause__", None), "sqlstate", None
        ) == UNIQUE_VIOLATION

    def is_connection_error(self, exc: BaseException) -> bool:
        return bool(getattr(exc, "connection_invalidated", False))


def create_engine(url: str, pool_size: int) -> AsyncEngine:
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={"server_settings": {"application_name": "mainspring"}},
    )
