"""Periodic work: cron schedules that create one interaction per tick.

A schedule (``@app.periodic(...)`` in code, or ``PUT /v1/periodic/{name}``) names a cron expression, a
time zone and a queue. Whichever server finds a tick due creates its interaction with ``message_id``
``periodic:<name>:<tick>`` — the tick is the idempotency key, so two servers firing the same tick create it
once — and moves the schedule's ``next_tick`` on, in the same transaction. Ticks missed while no server ran
are created when one comes back, as far back as the schedule's ``catch_up_ms``; older ones are skipped.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from mainspring.core.errors import InvalidRequest
from mainspring.interactions import data, service
from mainspring.interactions.data import NewInteraction, ScheduleRow
from mainspring.interactions.errors import PeriodicNotFound
from mainspring.interactions.settings import InteractionsSettings
from mainspring.store import Store, format_time

log = logging.getLogger("mainspring.interactions.periodic")

DEFAULT_CATCH_UP_MS = 3_600_000
MAX_TICKS_PER_ROUND = 1000


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidRequest(f"unknown time zone {name!r}", errors=[{"loc": ["body", "timezone"], "msg": "an IANA time zone name"}]) from exc


def validate(cron: str, timezone: str) -> None:
    """A 422 for a cron expression or time zone that cannot be followed."""
    zone = _zone(timezone)
    try:
        next(CronSim(cron, datetime.now(zone)))
    except (CronSimError, StopIteration) as exc:
        raise InvalidRequest(f"invalid cron expression {cron!r}: {exc}", errors=[{"loc": ["body", "cron"], "msg": str(exc)}]) from exc


def next_tick_after(cron: str, timezone: str, after_ms: int) -> int:
    """The first tick strictly after ``after_ms`` (epoch ms)."""
    start = datetime.fromtimestamp(after_ms / 1000, _zone(timezone))
    tick = next(CronSim(cron, start))
    ms = int(tick.timestamp() * 1000)
    return ms if ms > after_ms else next_tick_after(cron, timezone, ms)


def schedule_to_api(row: ScheduleRow) -> dict[str, Any]:
    return {
        "name": row.name, "cron": row.cron, "timezone": row.timezone, "queue": row.queue, "data": row.data,
        "catch_up_ms": row.catch_up_ms, "next_tick": format_time(row.next_tick), "source": row.source,
        "created_at": format_time(row.created_at), "updated_at": format_time(row.updated_at),
    }


async def put_schedule(
    store: Store, name: str, *, cron: str, queue: str, data_: Any = None, timezone: str = "UTC",
    catch_up_ms: int = DEFAULT_CATCH_UP_MS, source: str = "api",
) -> dict[str, Any]:
    """Create or replace schedule ``name``; ticks from now on (a replaced one keeps its place when the
    expression is unchanged)."""
    validate(cron, timezone)
    now = store.now_ms()
    async with store.transaction() as tx:
        existing = await data.get_schedule(tx, name)
        same = existing is not None and (existing.cron, existing.timezone) == (cron, timezone)
        next_tick = existing.next_tick if same and existing is not None else next_tick_after(cron, timezone, now)
        created = existing.created_at if existing is not None else now
        await data.put_schedule(tx, ScheduleRow(name, cron, timezone, queue, data_, catch_up_ms, next_tick, source, created, now))
        tx.notify(PERIODIC_CHANNEL)
    return await get_schedule(store, name)


async def get_schedule(store: Store, name: str) -> dict[str, Any]:
    async with store.read() as conn:
        row = await data.get_schedule(conn, name)
    if row is None:
        raise PeriodicNotFound(f"no schedule {name!r}")
    return schedule_to_api(row)


async def list_schedules(store: Store) -> list[dict[str, Any]]:
    async with store.read() as conn:
        return [schedule_to_api(r) for r in await data.list_schedules(conn)]


async def delete_schedule(store: Store, name: str) -> None:
    async with store.transaction() as tx:
        if not await data.delete_schedule(tx, name):
            raise PeriodicNotFound(f"no schedule {name!r}")


PERIODIC_CHANNEL = "interactions-periodic"


async def fire_due_schedules(store: Store, cfg: InteractionsSettings) -> int | None:
    """Create the interactions of every due tick (one transaction, each schedule locked by one server);
    answers when the next tick is due."""
    now = store.now_ms()
    async with store.transaction() as tx:
        for schedule in await data.take_due_schedules(tx, now):
            # A tick older than the catch-up window is skipped: after a long outage, run once, not 1,000 times.
            tick = max(schedule.next_tick, next_tick_after(schedule.cron, schedule.timezone, now - schedule.catch_up_ms - 1))
            skipped = tick != schedule.next_tick
            batch: list[NewInteraction] = []
            while tick <= now and len(batch) < MAX_TICKS_PER_ROUND:
                batch.append(NewInteraction(
                    queue=schedule.queue, data=schedule.data, name=schedule.name, source="periodic",
                    message_id=f"periodic:{schedule.name}:{tick}", due_at=tick,
                ))
                tick = next_tick_after(schedule.cron, schedule.timezone, tick)
            if skipped:
                log.warning("schedule %s skipped ticks from %s (older than its catch-up window)", schedule.name, format_time(schedule.next_tick))
            await service.create_in(tx, cfg, batch)
            await data.set_next_tick(tx, schedule.name, tick)
    async with store.read() as conn:
        return await data.earliest_tick(conn)
