"""What differs between the engines, behind one small interface.

Every query is written once in SQLAlchemy Core; only the few things below have an engine-specific form.
"""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import Select, Table
from sqlalchemy.ext.asyncio import AsyncConnection


class Dialect(Protocol):
    name: str

    def insert(self, table: Table) -> Any:
        """An INSERT that supports ``on_conflict_do_nothing`` / ``on_conflict_do_update``."""

    def skip_locked(self, query: Select[Any]) -> Select[Any]:
        """Rows no other transaction holds (PostgreSQL); SQLite has one writer, so all rows."""

    def for_update(self, query: Select[Any]) -> Select[Any]:
        """Lock the rows read until commit (PostgreSQL); a no-op under SQLite's single writer."""

    async def advisory_xact_lock(self, conn: AsyncConnection, key: str) -> None:
        """Serialize transactions on ``key`` until commit."""

    async def try_advisory_xact_lock(self, conn: AsyncConnection, key: str) -> bool:
        """Like ``advisory_xact_lock`` but answers False at once if another transaction holds it."""

    async def notify(self, conn: AsyncConnection, channels: list[str]) -> None:
        """Send wake-ups to other servers at commit (PostgreSQL); SQLite has no other servers."""

    def is_unique_violation(self, exc: BaseException) -> bool: ...

    def is_connection_error(self, exc: BaseException) -> bool: ...
