"""Seed 004 §2 (processing the stream), §3 (idle service), §4 (PostgreSQL pub/sub), §5 (locking), §8 (errors)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import insert

from mainspring.config import Settings
from mainspring.core.outbox import SEQUENCER_CHANNEL
from mainspring.interactions import leasing, service
from mainspring.interactions.errors import InteractionNotFound
from mainspring.interactions.outcomes import Complete
from mainspring.interactions.settings import InteractionsSettings
from mainspring.interactions.tables import interactions as items
from mainspring.store import Clock, ManualClock, Store, format_time
from tests.interactions.conftest import create, get, lease, put_queue, release


async def test_2_1_next_leases_due_unfinished_items_in_due_order(client: httpx.AsyncClient, clock: ManualClock) -> None:
    later = await create(client, process_in_ms=10)
    first = await create(client)
    done = await create(client)
    await client.post(f"/v1/interactions/{done['id']}/complete", json={})
    gone = await create(client)
    await client.post(f"/v1/interactions/{gone['id']}/cancel")
    future = await create(client, process_in_ms=60_000)
    clock.advance(10)
    taken = await lease(client, max=10)
    assert [i["id"] for i in taken] == [first["id"], later["id"]]
    assert all(i["status"] == "processing" and i["lease"]["token"] for i in taken)
    assert (await get(client, future["id"]))["status"] == "scheduled"


async def test_2_1_small_leases_take_the_highest_priority_first_then_due_order(client: httpx.AsyncClient, clock: ManualClock) -> None:
    # SQLite reads the due items level by level of priority: the order across levels, due times and ids, and a
    # level whose items are all scheduled later, must come out as one ORDER BY would.
    made = []
    for priority, delay in [(0, 5), (5, 9), (0, 0), (-3, 0), (5, 1), (9, 60_000), (0, 2), (5, 1)]:
        item = await create(client, priority=priority, process_in_ms=delay or None)
        made.append((priority, delay, item["id"]))
    clock.advance(10)
    due = sorted((m for m in made if m[1] <= 10), key=lambda m: (-m[0], m[1], m[2]))
    taken = [i["id"] for _ in range(4) for i in await lease(client, max=2)]
    assert taken == [m[2] for m in due][:8]
    assert await lease(client, max=2) == []  # the priority 9 item is scheduled an hour later


async def test_2_2_outcomes_complete_fail_repeat_wait_retry(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, error_delay_ms=5000, max_attempts=3)
    ids = [(await create(client, data=i))["id"] for i in range(5)]
    taken = {i["id"]: i for i in await lease(client, max=5)}
    ok = await release(client, taken[ids[0]], {"complete": {"result": "r"}})
    assert (ok["status"], ok["next_processing"], ok["result"]) == ("completed", None, "r")
    bad = await release(client, taken[ids[1]], {"fail": {"error": "why"}})
    assert (bad["status"], bad["error"]) == ("failed", "why")
    again = await release(client, taken[ids[2]], {"repeat": {"in_ms": 700}})
    assert (again["status"], again["next_processing"]) == ("scheduled", format_time(clock.now_ms() + 700))
    at = format_time(clock.now_ms() + 900)
    assert (await release(client, taken[ids[3]], {"repeat": {"at": at}}))["next_processing"] == at
    waiting = await release(client, taken[ids[4]], {"wait": {}})
    assert (waiting["status"], waiting["next_processing"]) == ("waiting", None)


async def test_2_3_rate_limit_caps_starts_per_window(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, rate_limit={"count": 3, "per_ms": 1000})
    for _ in range(8):
        await create(client)
    first = await lease(client, max=10)
    assert len(first) == 3
    for item in first:
        await release(client, item, {"complete": {}})
    assert await lease(client, max=10) == []
    clock.advance(1000)
    assert len(await lease(client, max=2)) == 2
    assert len(await lease(client, max=10)) == 1
    queue = (await client.get("/v1/queues/q")).json()
    assert queue["rate_limit"] == {"count": 3, "per_ms": 1000}


async def test_2_4_concurrency_caps_leased_items(client: httpx.AsyncClient) -> None:
    await put_queue(client, concurrency=2)
    for _ in range(5):
        await create(client)
    held = await lease(client, max=10)
    assert len(held) == 2
    assert await lease(client, max=10) == []
    await release(client, held[0], {"complete": {}})
    assert len(await lease(client, max=10)) == 1
    counts = (await client.get("/v1/queues/q")).json()["counts"]
    assert counts["processing"] == 2 and counts["ready"] == 2 and counts["completed"] == 1


async def test_3_1_idle_lease_tells_when_the_next_scheduled_item_is_due(store: Store, settings: Settings, clock: ManualClock) -> None:
    cfg = settings.interactions
    await service.create(store, cfg, "q", {"due_at": clock.now_ms() + 5000})
    taken = await leasing.lease(store, cfg, "q", "w", 10)
    assert taken.items == [] and taken.next_due == clock.now_ms() + 5000

    async def advance_soon() -> None:
        await asyncio.sleep(0.05)
        clock.advance(5000)

    mover = asyncio.create_task(advance_soon())
    woke = await leasing.lease_wait(store, cfg, "q", "w", 10, None, 5000, poll_ms=60_000)
    await mover
    assert len(woke.items) == 1


async def test_3_2_idle_lease_looks_again_at_the_poll_interval_or_the_next_due_time_if_sooner(database_url: str, settings: Settings) -> None:
    cfg = settings.interactions
    real = Store(database_url, clock=Clock(), pool_size=2)
    try:
        await service.create(real, cfg, "q", {"due_at": real.now_ms() + 300})
        started = time.monotonic()
        soon = await leasing.lease_wait(real, cfg, "q", "w", 10, None, 10_000, poll_ms=60_000)
        assert len(soon.items) == 1 and time.monotonic() - started < 3
        # Written behind the server's back (no wake-up): found by the poll backstop.
        async with real.transaction() as tx:
            now = real.now_ms()
            await tx.execute(insert(items).values(queue="q", state="queued", next_processing=now, attempts=0, created_at=now, updated_at=now))
        started = time.monotonic()
        polled = await leasing.lease_wait(real, cfg, "q", "w", 10, None, 10_000, poll_ms=300)
        assert len(polled.items) == 1 and time.monotonic() - started < 3
    finally:
        await real.close()


async def test_4_1_notify_wakes_a_waiting_lease_without_waiting_for_the_poll_interval(database_url: str, engine: str, store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    # On PostgreSQL the creator is another server (its own pool and LISTEN connection); SQLite has one.
    other = Store(database_url, clock=Clock(), pool_size=2) if engine == "postgres" else store
    waiting_side = Store(database_url, clock=Clock(), pool_size=2) if engine == "postgres" else store
    try:
        await other.start()
        await waiting_side.start()
        if engine == "postgres":
            assert waiting_side._listener is not None
            await asyncio.wait_for(waiting_side._listener.connected.wait(), 10)
        started = time.monotonic()
        waiter = asyncio.create_task(leasing.lease_wait(waiting_side, cfg, "q", "w", 1, None, 20_000, poll_ms=60_000))
        await asyncio.sleep(0.2)
        await service.create(other, cfg, "q", {})
        taken = await asyncio.wait_for(waiter, 10)
        assert len(taken.items) == 1
        assert time.monotonic() - started < 3
    finally:
        if other is not store:
            await other.close()
            await waiting_side.close()


async def test_5_1_every_update_stamps_updated_at(client: httpx.AsyncClient, clock: ManualClock) -> None:
    item = await create(client)
    clock.advance(10)
    [held] = await lease(client)
    assert held["updated_at"] == format_time(clock.now_ms())
    clock.advance(10)
    after = await release(client, held, {"repeat": {"in_ms": 5}})
    assert after["updated_at"] == format_time(clock.now_ms())
    clock.advance(10)
    moved = (await client.post(f"/v1/interactions/{item['id']}/schedule", json={"process_in_ms": 5})).json()
    assert moved["updated_at"] == format_time(clock.now_ms())


async def test_5_2_an_item_is_locked_while_processed_and_unlocked_after(client: httpx.AsyncClient) -> None:
    item = await create(client)
    [held] = await lease(client)
    assert (await get(client, item["id"]))["status"] == "processing"
    assert await lease(client) == []
    after = await release(client, held, {"repeat": {"in_ms": 0}})
    assert after["status"] == "ready" and after["lease"] is None
    assert len(await lease(client)) == 1


async def test_5_3_heartbeat_extends_the_lease(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await create(client)
    [held] = await lease(client, lease_ms=1000)
    clock.advance(800)
    beat = await client.post(f"/v1/interactions/{held['id']}/heartbeat", json={"token": held["lease"]["token"], "lease_ms": 1000})
    assert beat.status_code == 200 and beat.json()["expires_at"] == format_time(clock.now_ms() + 1000)
    clock.advance(800)
    assert await lease(client) == []
    assert (await release(client, held, {"complete": {}}))["status"] == "completed"
    lost = await client.post(f"/v1/interactions/{held['id']}/heartbeat", json={"token": held["lease"]["token"]})
    assert lost.status_code == 409 and lost.json()["code"] == "lease_lost"


async def test_5_4_an_unreleased_lease_expires_and_the_item_is_retried(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, error_delay_ms=500, max_attempts=2, lease_ms=1000)
    item = await create(client)
    await lease(client)
    clock.advance(1000)
    assert await lease(client) == []
    retried = await get(client, item["id"])
    assert (retried["status"], retried["error"], retried["attempts"]) == ("scheduled", "lease expired", 1)
    clock.advance(500)
    [second] = await lease(client)
    assert second["attempts"] == 2
    clock.advance(1000)
    await lease(client)
    failed = await get(client, item["id"])
    assert (failed["status"], failed["error"]) == ("failed", "lease expired")


async def test_5_4_expired_leases_are_found_without_a_lease_call(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, error_delay_ms=0, lease_ms=1000)
    item = await create(client)
    await lease(client)
    clock.advance(1000)
    for _ in range(100):
        if (await get(client, item["id"]))["status"] == "ready":
            break
        await asyncio.sleep(0.05)
    assert (await get(client, item["id"]))["status"] == "ready"


async def test_a_late_worker_cannot_release_an_item_another_worker_holds(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, error_delay_ms=0, lease_ms=1000)
    await create(client)
    [first] = await lease(client)
    clock.advance(1001)
    [second] = await lease(client)
    assert first["id"] == second["id"] and first["lease"]["token"] != second["lease"]["token"]
    late = await client.post(f"/v1/interactions/{first['id']}/release", json={"token": first["lease"]["token"], "outcome": {"complete": {"result": "late"}}})
    assert late.status_code == 409 and late.json()["code"] == "lease_lost"
    done = await release(client, second, {"complete": {"result": "on time"}})
    assert done["result"] == "on time"


async def test_8_1_retry_is_due_after_error_delay_and_fails_once_attempts_are_spent(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, error_delay_ms=2000, max_attempts=2)
    item = await create(client)
    [held] = await lease(client)
    retried = await release(client, held, {"retry": {"error": "flaky"}})
    assert (retried["status"], retried["error"], retried["next_processing"]) == ("scheduled", "flaky", format_time(clock.now_ms() + 2000))
    clock.advance(1999)
    assert await lease(client) == []
    clock.advance(1)
    [held] = await lease(client)
    spent = await release(client, held, {"retry": {"error": "still flaky"}})
    assert (spent["status"], spent["error"]) == ("failed", "still flaky")
    assert (await get(client, item["id"]))["status"] == "failed"


async def test_8_2_the_store_never_extends_a_lease_past_the_processing_timeout(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, processing_timeout_ms=1500, lease_ms=1000, error_delay_ms=0)
    await create(client)
    [held] = await lease(client)
    clock.advance(900)
    beat = await client.post(f"/v1/interactions/{held['id']}/heartbeat", json={"token": held["lease"]["token"]})
    assert beat.json()["expires_at"] == format_time(clock.now_ms() - 900 + 1500)
    clock.advance(600)
    lost = await client.post(f"/v1/interactions/{held['id']}/heartbeat", json={"token": held["lease"]["token"]})
    assert lost.status_code == 409
    [again] = await lease(client)
    assert again["attempts"] == 2


async def test_queue_settings_apply_on_every_server_at_once(database_url: str, store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    other = Store(database_url, clock=store.clock, pool_size=2)
    try:
        for _ in range(4):
            await service.create(store, cfg, "q", {})
        await service.put_queue(store, cfg, "q", {"concurrency": 1})
        assert len((await leasing.lease(other, cfg, "q", "w2", 10)).items) == 1
        await service.put_queue(other, cfg, "q", {"concurrency": 3})
        assert len((await leasing.lease(store, cfg, "q", "w1", 10)).items) == 2
    finally:
        await other.close()


async def test_retention_prunes_finished_items_in_batches(store: Store, settings: Settings, clock: ManualClock) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"retention_ms": 1000})
    done = [(await service.create(store, cfg, "q", {"completed": True}))[0]["id"] for _ in range(3)]
    open_item, _ = await service.create(store, cfg, "q", {})
    clock.advance(1001)
    assert await service.prune_finished(store, batch=2) == 2
    assert await service.prune_finished(store, batch=2) == 1
    for item_id in done:
        with pytest.raises(InteractionNotFound):
            await service.read(store, item_id)
    assert (await service.read(store, open_item["id"]))["status"] == "ready"


async def test_retention_loop_runs_by_itself(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, retention_ms=1000)
    item = await create(client, completed=True)
    clock.advance(2000)
    for _ in range(100):
        if (await client.get(f"/v1/interactions/{item['id']}")).status_code == 404:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the retention loop did not prune")


async def test_a_full_queue_waits_for_a_release_or_an_expiry_not_a_busy_loop(
    store: Store, settings: Settings, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"concurrency": 1, "lease_ms": 5000})
    for _ in range(2):
        await service.create(store, cfg, "q", {})
    first = await leasing.lease(store, cfg, "q", "w", 1)
    full = await leasing.lease(store, cfg, "q", "w", 1)
    assert full.items == [] and full.next_due == clock.now_ms() + 5000
    calls = 0
    real_lease = leasing.lease

    async def counted(*args: Any, **kwargs: Any) -> leasing.Leased:
        nonlocal calls
        calls += 1
        return await real_lease(*args, **kwargs)

    monkeypatch.setattr(leasing, "lease", counted)
    began = time.monotonic()
    waiting = asyncio.create_task(leasing.lease_wait(store, cfg, "q", "w", 1, None, 10_000, poll_ms=60_000))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    assert calls <= 2
    item = first.items[0]
    await leasing.release(store, item["id"], item["lease"]["token"], Complete())
    taken = await asyncio.wait_for(waiting, 5)
    assert len(taken.items) == 1 and time.monotonic() - began < 3


async def test_an_item_made_due_by_direct_sql_wakes_a_waiting_worker_on_postgresql(store: Store, engine: str, database_url: str) -> None:
    """Seed 004 §4.1: an operator's UPDATE of next_processing wakes the workers; they do not wait for their poll."""
    if engine != "postgres":
        pytest.skip("SQLite has no other writer to wake a worker through the database")
    cfg = InteractionsSettings()
    item, _ = await service.create(store, cfg, "q", {"due_at": store.now_ms() + 3_600_000})
    waiting_side = Store(database_url, clock=store.clock, pool_size=2)
    await waiting_side.start()
    await waiting_side.listening()
    try:
        waiter = asyncio.create_task(leasing.lease_wait(waiting_side, cfg, "q", "w", 1, None, 20_000, poll_ms=60_000))
        await asyncio.sleep(0.3)
        assert not waiter.done()
        operator = await asyncpg.connect(database_url)
        try:
            await operator.execute("UPDATE interactions SET next_processing = $1 WHERE id = $2", store.now_ms(), int(item["id"]))
        finally:
            await operator.close()
        taken = await asyncio.wait_for(waiter, 5)
        assert [i["id"] for i in taken.items] == [item["id"]]
    finally:
        await waiting_side.close()


@pytest.mark.parametrize("limits", [{}, {"concurrency": 5}], ids=["unlimited", "limited"])
async def test_a_lease_takes_no_more_than_asked_after_its_statement_ran_many_times(store: Store, limits: dict[str, Any]) -> None:
    """On PostgreSQL a prepared statement gets a generic plan after its fifth run; one that ran the pick of
    ``UPDATE … WHERE id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)`` once per row took all twelve."""
    cfg = InteractionsSettings()
    await service.put_queue(store, cfg, "q", limits)
    for _ in range(8):
        assert (await leasing.lease(store, cfg, "q", "w", 1)).items == []
    for i in range(12):
        await service.create(store, cfg, "q", {"data": i})
    assert len((await leasing.lease(store, cfg, "q", "w", 1)).items) == 1
    assert len((await leasing.lease(store, cfg, "q", "w", 2)).items) == 2


@pytest.mark.parametrize("limits", [{}, {"concurrency": 5}], ids=["unlimited", "limited"])
async def test_a_lease_wakes_the_event_sequencer_when_it_took_items_and_not_when_it_took_none(
    database_url: str, limits: dict[str, Any]
) -> None:
    """A lease's ``interaction.changed`` events are numbered by the sequencer, which this server wakes at the
    commit; an empty lease wakes nothing. The store never listens, so only its own signals reach its waiters."""
    store = Store(database_url)
    try:
        cfg = InteractionsSettings()
        await service.put_queue(store, cfg, "q", limits)
        for _ in range(2):  # the first lease of an unlimited queue learns it is unlimited; the second is one statement
            sequencer = store.notifier.waiter(SEQUENCER_CHANNEL)
            assert (await leasing.lease(store, cfg, "q", "w", 1)).items == []
            assert not sequencer.signalled
        for _ in range(2):
            await service.create(store, cfg, "q", {"data": 1})
            sequencer = store.notifier.waiter(SEQUENCER_CHANNEL)
            assert len((await leasing.lease(store, cfg, "q", "w", 1)).items) == 1
            assert sequencer.signalled
    finally:
        await store.close()
