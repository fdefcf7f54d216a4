"""Wake-ups, background loops and fenced lease writes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, select

from mainspring.config import Settings
from mainspring.core.errors import LeaseLost
from mainspring.core.leases import fenced_update, new_token
from mainspring.core.runtime import Context, retry_while_unavailable, run_loop
from mainspring.store import ManualClock, Store
from mainspring.store.notify import Notifier, payloads
from mainspring.store.postgres import notify_and_commit


async def test_notify_wakes_a_waiter_on_another_server(store: Store, database_url: str) -> None:
    other = Store(database_url)
    await other.start()
    try:
        await other.listening()
        waiter = (other if store.is_postgres else store).notifier.waiter("interactions")
        async with store.transaction() as tx:
            tx.notify("interactions:emails")
        assert await waiter.wait(5)
    finally:
        await other.close()


async def test_one_commit_sends_one_notify_that_wakes_each_of_its_channels_on_another_server(store: Store, database_url: str) -> None:
    if not store.is_postgres:
        pytest.skip("NOTIFY is PostgreSQL's; SQLite's servers share a Unix socket")
    other = Store(database_url)
    await other.start()
    try:
        await other.listening()
        waiters = [other.notifier.waiter(channel) for channel in ("interactions:emails", "events", "batching:b")]
        async with store.transaction() as tx:
            await tx.execute(select(1))
            for channel in ("interactions:emails", "events", "batching:b"):
                tx.notify(channel)
            sql = notify_and_commit(tx.channels)
        assert sql.count("pg_notify") == 1
        for waiter in waiters:
            assert await waiter.wait(5)
    finally:
        await other.close()


def test_wake_ups_too_long_for_one_notify_are_split_under_the_payload_limit() -> None:
    channels = [f"interactions:queue-{i:04d}" + "x" * 100 for i in range(200)]
    sent = payloads(channels)
    assert len(sent) > 1 and all(len(p.encode()) < 8000 for p in sent)
    assert [c for p in sent for c in p.split(" ")] == channels
    assert payloads(["events"]) == ["events"]


async def test_a_waiter_taken_before_the_signal_never_misses_it() -> None:
    notifier = Notifier()
    waiter = notifier.waiter("faces:x")
    notifier.signal("faces:x")
    assert await waiter.wait(0.01)
    assert not await notifier.waiter("faces:x").wait(0.01)


async def test_loop_sleeps_until_the_step_says_work_is_due(settings: Settings, store: Store, clock: ManualClock) -> None:
    await store.listening()  # its first connect wakes everything once, by design
    ctx = Context(settings=settings, store=store)
    due_at = clock.now_ms() + 60_000
    rounds: list[int] = []

    async def step() -> int | None:
        rounds.append(clock.now_ms())
        return due_at if clock.now_ms() < due_at else None  # the due work is done in the second round

    task = asyncio.create_task(run_loop(ctx, "test", step, channel="test", poll_ms=60_000))
    await asyncio.sleep(0.1)
    assert len(rounds) == 1
    clock.advance(60_000)  # time moves: the loop re-checks at once instead of sleeping a minute
    await asyncio.sleep(0.1)
    assert len(rounds) == 2
    ctx.stopping.set()
    store.notifier.signal_all()
    await asyncio.wait_for(task, 5)


async def test_loop_survives_a_failing_step(settings: Settings, store: Store) -> None:
    ctx = Context(settings=settings, store=store)
    calls = 0

    async def step() -> int | None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise RuntimeError("transient")
        ctx.stopping.set()
        return None

    await asyncio.wait_for(run_loop(ctx, "test", step, channel="test", poll_ms=50), 5)
    assert calls == 3


@pytest.fixture
async def leased(store: Store) -> Any:
    table = Table("lease_test", MetaData(), Column("id", Integer, primary_key=True), Column("lease_token", String(40)), Column("value", Integer))
    async with store.transaction() as tx:
        await tx.session.conn.run_sync(table.metadata.create_all) if store.is_postgres else table.metadata.create_all(tx.session.conn)
        await tx.execute(table.insert().values(id=1, lease_token="old", value=0))
    return table


async def test_write_with_a_lost_lease_is_refused_and_changes_nothing(store: Store, leased: Table) -> None:
    token = new_token()
    async with store.transaction() as tx:
        await tx.execute(leased.update().values(lease_token=token))  # taken over
    with pytest.raises(LeaseLost):
        async with store.transaction() as tx:
            await fenced_update(tx, leased, leased.c.id == 1, "old", value=1)
    async with store.transaction() as tx:
        await fenced_update(tx, leased, leased.c.id == 1, token, value=2)
    async with store.read() as conn:
        assert (await conn.execute(select(leased.c.value))).scalar_one() == 2


async def test_retry_while_unavailable_tries_again_while_the_store_is_unreachable() -> None:
    calls: list[int] = []

    async def work() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("the store is restarting")
        return "written"

    assert await retry_while_unavailable("writing", work, within_ms=5_000) == "written"
    assert len(calls) == 3


async def test_retry_while_unavailable_raises_any_other_error_at_once() -> None:
    calls: list[int] = []

    async def work() -> None:
        calls.append(1)
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError, match="a bug"):
        await retry_while_unavailable("writing", work, within_ms=5_000)
    assert calls == [1]


async def test_retry_while_unavailable_gives_up_after_its_window() -> None:
    async def work() -> None:
        raise ConnectionRefusedError("still down")

    with pytest.raises(ConnectionRefusedError):
        await retry_while_unavailable("writing", work, within_ms=300)


async def test_a_server_of_its_own_process_settles_its_heap_once_started_and_an_embedded_one_does_not(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mainspring.api

    settled: list[bool] = []
    monkeypatch.setattr(mainspring.api, "settle_heap", lambda: settled.append(True))
    for own_process in (False, True):
        app = mainspring.api.create_app(settings, run_background=False, own_process=own_process)  # its own store, closed with it
        async with app.router.lifespan_context(app):
            pass
        assert settled == ([True] if own_process else []), own_process
