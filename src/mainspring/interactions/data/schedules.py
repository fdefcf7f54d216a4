"""Schedules (periodic work): cron rows and the ticks that are due."""

from __future__ import annotations

from sqlalchemy import bindparam, func, select

from mainspring.interactions.data.rows import ScheduleRow
from mainspring.interactions.tables import interaction_schedules as schedules
from mainspring.store import Transaction
from mainspring.store.dialect import Executor

SCHEDULE_FIELDS = ("cron", "timezone", "queue", "data", "catch_up_ms", "next_tick", "source")


async def put_schedule(tx: Transaction, row: ScheduleRow) -> None:
    """Create or replace a schedule (its ``created_at`` stays)."""
    values = {k: getattr(row, k) for k in SCHEDULE_FIELDS}
    stmt = tx.store.dialect.insert(schedules).values(name=row.name, created_at=row.created_at, updated_at=row.updated_at, **values)
    await tx.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={**values, "updated_at": row.updated_at}))


_SCHEDULE = select(schedules).where(schedules.c.name == bindparam("name"))


async def get_schedule(conn: Executor, name: str) -> ScheduleRow | None:
    row = (await conn.execute(_SCHEDULE, {"name": name})).first()
    return None if row is None else ScheduleRow(*row)


async def list_schedules(conn: Executor) -> list[ScheduleRow]:
    return [ScheduleRow(*r) for r in (await conn.execute(select(schedules).order_by(schedules.c.name))).all()]


async def delete_schedule(tx: Executor, name: str) -> bool:
    return bool((await tx.execute(schedules.delete().where(schedules.c.name == name))).rowcount)


async def take_due_schedules(tx: Transaction, now: int) -> list[ScheduleRow]:
    """Schedules with a tick due, locked (SKIP LOCKED: each is fired by one server at a time)."""
    query = select(schedules).where(schedules.c.next_tick <= now).order_by(schedules.c.next_tick)
    return [ScheduleRow(*r) for r in (await tx.execute(tx.store.dialect.skip_locked(query))).all()]


async def set_next_tick(tx: Executor, name: str, next_tick: int) -> None:
    await tx.execute(schedules.update().where(schedules.c.name == name).values(next_tick=next_tick))


async def earliest_tick(conn: Executor) -> int | None:
    value = (await conn.execute(select(func.min(schedules.c.next_tick)))).scalar()
    return None if value is None else int(value)

