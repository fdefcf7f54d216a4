"""The store on both engines: migrations, transactions, concurrency, the clock."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select

from mainspring.core import outbox
from mainspring.core.tables import events
from mainspring.store import ManualClock, Store, format_time, parse_time
from mainspring.store.migrate import migrate, pending_revisions


async def test_migrations_twice_are_a_no_op(store: Store) -> None:
    await migrate(store)
    await migrate(store)
    assert await pending_revisions(store) == set()


async def test_two_servers_migrating_one_database_at_once(database_url: str, engine: str) -> None:
    if engine != "postgres":
        pytest.skip("SQLite serves one machine; concurrent migration is a PostgreSQL concern")
    from tests.conftest import _pg_admin, pg_url

    name = database_url.rsplit("/", 1)[1] + "_fresh"
    await _pg_admin(f'CREATE DATABASE "{name}"')
    stores = [Store(pg_url(name)) for _ in range(3)]
    try:
        await asyncio.gather(*(migrate(s) for s in stores))
        assert await pending_revisions(stores[0]) == set()
    finally:
        for s in stores:
            await s.close()
        await _pg_admin(f'DROP DATABASE "{name}" WITH (FORCE)')


async def test_concurrent_writers_never_fail_with_database_locked(store: Store) -> None:
    async def write(i: int) -> None:
        async with store.transaction() as tx:
            await outbox.emit(tx, "test.write", "test", str(i))

    await asyncio.gather(*(write(i) for i in range(200)))
    async with store.read() as conn:
        assert (await conn.execute(select(func.count()).select_from(events))).scalar_one() == 200


async def test_a_failed_transaction_leaves_nothing(store: Store) -> None:
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await outbox.emit(tx, "test.write", "test", "1")
            raise RuntimeError("boom")
    async with store.read() as conn:
        assert (await conn.execute(select(func.count()).select_from(events))).scalar_one() == 0


def test_time_is_rfc3339_utc_with_milliseconds() -> None:
    assert format_time(1_800_000_000_123) == "2027-01-15T08:00:00.123Z"
    assert parse_time("2027-01-15T08:00:00.123Z") == 1_800_000_000_123
    assert parse_time("2027-01-15T10:00:00.123+02:00") == 1_800_000_000_123


def test_manual_clock_moves_only_when_told_and_wakes_subscribers() -> None:
    clock = ManualClock(1000)
    woken: list[int] = []
    clock.subscribe(lambda: woken.append(clock.now_ms()))
    assert clock.now_ms() == 1000
    clock.advance(500)
    assert clock.now_ms() == 1500
    assert woken == [1500]
