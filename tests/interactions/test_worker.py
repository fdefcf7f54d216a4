"""The worker runtime in one process: handlers, outcomes, timeouts, cancellation, stopping (seed 004 §7, §8)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from mainspring.app import App
from mainspring.config import Settings
from mainspring.interactions import service
from mainspring.interactions.outcomes import Fail, Repeat, Wait
from mainspring.interactions.worker import Worker
from mainspring.store import ManualClock, Store


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


async def status(store: Store, item_id: str) -> str:
    return str((await service.read(store, item_id))["status"])


@pytest.fixture
def cfg(settings: Settings) -> Any:
    return settings.interactions


async def started(store: Store, registry: App, cfg: Any) -> Worker:
    worker = Worker(store, registry, cfg, poll_ms=200)
    await worker.start()
    return worker


async def test_handlers_async_and_sync_return_outcomes(store: Store, cfg: Any) -> None:
    app = App()

    @app.queue("async")
    async def handle_async(item: Any) -> Any:
        return {"echo": item.data}

    @app.queue("sync")
    def handle_sync(item: Any) -> Any:
        return {"fail": Fail("no"), "wait": Wait(), "repeat": Repeat(in_ms=60_000)}[item.data]

    worker = await started(store, app, cfg)
    try:
        a, _ = await service.create(store, cfg, "async", {"data": 7})
        made = {kind: (await service.create(store, cfg, "sync", {"data": kind}))[0]["id"] for kind in ("fail", "wait", "repeat")}
        await eventually(lambda: _is(store, a["id"], "completed"))
        assert (await service.read(store, a["id"]))["result"] == {"echo": 7}
        await eventually(lambda: _is(store, made["fail"], "failed"))
        await eventually(lambda: _is(store, made["wait"], "waiting"))
        await eventually(lambda: _is(store, made["repeat"], "scheduled"))
    finally:
        await worker.stop()


async def _is(store: Store, item_id: str, wanted: str) -> bool:
    return await status(store, item_id) == wanted


async def test_8_1_a_raising_handler_is_retried_after_error_delay(store: Store, cfg: Any, clock: ManualClock) -> None:
    app = App()
    calls: list[int] = []

    @app.queue("q")
    async def flaky(item: Any) -> Any:
        calls.append(item.attempts)
        if len(calls) == 1:
            raise RuntimeError("first time fails")
        return "ok"

    await service.put_queue(store, cfg, "q", {"error_delay_ms": 5000})
    worker = await started(store, app, cfg)
    try:
        item, _ = await service.create(store, cfg, "q", {})
        await eventually(lambda: _is(store, item["id"], "scheduled"))
        assert (await service.read(store, item["id"]))["error"] == "RuntimeError: first time fails"
        clock.advance(5000)
        await eventually(lambda: _is(store, item["id"], "completed"))
        assert calls == [1, 2]
    finally:
        await worker.stop()


async def test_8_2_processing_timeout_cancels_the_handler(store: Store, cfg: Any) -> None:
    app = App()
    cancelled = asyncio.Event()

    @app.queue("q", timeout_ms=200)
    async def slow(item: Any) -> Any:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await service.put_queue(store, cfg, "q", {"error_delay_ms": 60_000})
    worker = await started(store, app, cfg)
    try:
        item, _ = await service.create(store, cfg, "q", {})
        await asyncio.wait_for(cancelled.wait(), 10)
        await eventually(lambda: _is(store, item["id"], "scheduled"))
        assert "timed out" in (await service.read(store, item["id"]))["error"]
    finally:
        await worker.stop()


async def test_8_2_the_queue_processing_timeout_applies_to_running_workers(store: Store, cfg: Any) -> None:
    app = App()
    cancelled = asyncio.Event()

    @app.queue("q")
    async def slow(item: Any) -> Any:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await service.put_queue(store, cfg, "q", {"processing_timeout_ms": 300, "error_delay_ms": 60_000})
    worker = await started(store, app, cfg)
    try:
        await service.create(store, cfg, "q", {})
        await asyncio.wait_for(cancelled.wait(), 10)
    finally:
        await worker.stop()


def long_handler(app: App, queue: str) -> tuple[asyncio.Event, asyncio.Event]:
    """A handler of ``queue`` that runs a minute unless cancelled; the events it sets when it runs, when cancelled."""
    running = asyncio.Event()
    cancelled = asyncio.Event()

    @app.queue(queue)
    async def long(item: Any) -> Any:
        running.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    return running, cancelled


async def test_cancelling_an_item_being_processed_cancels_its_handler(store: Store, cfg: Any) -> None:
    app = App()
    running, cancelled = long_handler(app, "q")
    worker = await started(store, app, cfg)
    try:
        item, _ = await service.create(store, cfg, "q", {})
        await asyncio.wait_for(running.wait(), 10)
        await service.cancel(store, item["id"])
        await asyncio.wait_for(cancelled.wait(), 5)
        assert await status(store, item["id"]) == "cancelled"
    finally:
        await worker.stop()


async def test_cancelling_a_parent_cancels_the_handler_of_its_running_child(store: Store, cfg: Any) -> None:
    app = App()
    running, cancelled = long_handler(app, "children")
    parent, _ = await service.create(store, cfg, "parents", {"due_at": store.now_ms() + 3_600_000})
    worker = await started(store, app, cfg)
    try:
        child, _ = await service.create(store, cfg, "children", {"parent_id": int(parent["id"]), "name": "step"})
        await asyncio.wait_for(running.wait(), 10)
        await service.cancel(store, parent["id"])
        await asyncio.wait_for(cancelled.wait(), 5)  # long before a heartbeat (lease 30 s) would tell
        assert await status(store, child["id"]) == "cancelled"
    finally:
        await worker.stop()


async def test_a_workers_own_completions_do_not_make_it_read_its_leases_back(store: Store, cfg: Any) -> None:
    """Only a cancel makes a worker check which of its leases still hold: its own completions (most finishes
    of a busy queue) used to cost it a read of its leases after each batch."""
    app = App()
    done = asyncio.Event()
    handled = 0

    @app.queue("busy", concurrency=5, batch=5)
    async def quick(item: Any) -> None:
        nonlocal handled
        await asyncio.sleep(0.001 * (int(item.id) % 3))  # handlers finish at different moments
        handled += 1
        if handled == 60:
            done.set()

    worker = await started(store, app, cfg)
    checks = 0
    still_held = worker.source.still_held

    async def counted(leases: dict[int, str]) -> set[int]:
        nonlocal checks
        checks += 1
        return await still_held(leases)

    worker.source.still_held = counted  # type: ignore[method-assign]
    try:
        await service.create_many(store, cfg, "busy", [{"data": i} for i in range(60)])
        await asyncio.wait_for(done.wait(), 30)
        await eventually(lambda: _all_completed(store, cfg, "busy", 60))
        assert checks == 0
    finally:
        await worker.stop()


async def _all_completed(store: Store, cfg: Any, queue: str, n: int) -> bool:
    return bool((await service.get_queue(store, cfg, queue))["counts"]["completed"] == n)


async def test_7_1_stop_one_queue_and_await_it(store: Store, cfg: Any) -> None:
    app = App()
    release_a = asyncio.Event()
    a_running = asyncio.Event()

    @app.queue("a")
    async def handle_a(item: Any) -> Any:
        a_running.set()
        await release_a.wait()
        return "a done"

    @app.queue("b")
    async def handle_b(item: Any) -> Any:
        return "b done"

    worker = await started(store, app, cfg)
    try:
        first, _ = await service.create(store, cfg, "a", {})
        await asyncio.wait_for(a_running.wait(), 10)
        stopping = asyncio.create_task(worker.stop_queue("a"))
        await asyncio.sleep(0.1)
        assert not stopping.done()
        release_a.set()
        await asyncio.wait_for(stopping, 10)
        assert await status(store, first["id"]) == "completed"
        later, _ = await service.create(store, cfg, "a", {})
        b, _ = await service.create(store, cfg, "b", {})
        await eventually(lambda: _is(store, b["id"], "completed"))
        assert await status(store, later["id"]) == "ready"
    finally:
        await worker.stop()


async def test_7_2_graceful_stop_lets_running_handlers_finish(store: Store, cfg: Any) -> None:
    app = App()
    running = asyncio.Event()

    @app.queue("q")
    async def handle(item: Any) -> Any:
        running.set()
        await asyncio.sleep(0.3)
        return "finished"

    worker = await started(store, app, cfg)
    item, _ = await service.create(store, cfg, "q", {})
    await asyncio.wait_for(running.wait(), 10)
    await worker.stop(graceful=True, timeout_ms=5000)
    assert await status(store, item["id"]) == "completed"


async def test_7_3_forced_stop_cancels_handlers_and_their_leases_expire(store: Store, cfg: Any, clock: ManualClock) -> None:
    app = App()
    running = asyncio.Event()
    cancelled = asyncio.Event()

    @app.queue("q", lease_ms=1000)
    async def handle(item: Any) -> Any:
        running.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await service.put_queue(store, cfg, "q", {"error_delay_ms": 0})
    worker = await started(store, app, cfg)
    item, _ = await service.create(store, cfg, "q", {})
    await asyncio.wait_for(running.wait(), 10)
    await worker.stop(graceful=False)
    assert cancelled.is_set()
    assert await status(store, item["id"]) == "processing"
    clock.advance(1000)
    from mainspring.interactions import leasing

    taken = await leasing.lease(store, cfg, "q", "next", 1)
    assert [i["id"] for i in taken.items] == [item["id"]] and taken.items[0]["attempts"] == 2


async def test_a_graceful_stop_is_bounded(store: Store, cfg: Any) -> None:
    app = App()
    running = asyncio.Event()

    @app.queue("q")
    async def handle(item: Any) -> Any:
        running.set()
        await asyncio.sleep(60)

    worker = await started(store, app, cfg)
    await service.create(store, cfg, "q", {})
    await asyncio.wait_for(running.wait(), 10)
    began = time.monotonic()
    await worker.stop(graceful=True, timeout_ms=200)
    assert time.monotonic() - began < 3


async def test_a_handler_waits_for_the_child_it_created_and_is_woken_when_it_finishes(store: Store, cfg: Any) -> None:
    app = App()
    calls: list[int] = []

    @app.queue("orders")
    async def order(item: Any, ctx: Any) -> Any:
        calls.append(1)
        paid = await ctx.children("payment")
        if not paid:
            await ctx.create_child("payment", queue="payments", data={"amount": item.data["total"]})
            return Wait()
        return {"paid": paid[0]["result"]}

    @app.queue("payments")
    def payment(item: Any) -> Any:
        return {"charged": item.data["amount"]}

    worker = await started(store, app, cfg)
    try:
        item, _ = await service.create(store, cfg, "orders", {"data": {"total": 12}})
        await eventually(lambda: _is(store, item["id"], "completed"))
        assert (await service.read(store, item["id"]))["result"] == {"paid": {"charged": 12}}
        assert len(calls) == 2
    finally:
        await worker.stop()


async def test_5_3_the_runtime_heartbeats_a_long_handler_so_its_lease_never_lapses(database_url: str, cfg: Any) -> None:
    from mainspring.store import Clock

    real = Store(database_url, clock=Clock(), pool_size=3)
    app = App()

    @app.queue("q")
    async def long(item: Any) -> Any:
        await asyncio.sleep(1.5)
        return "done"

    await service.put_queue(real, cfg, "q", {"lease_ms": 500, "error_delay_ms": 0})
    worker = await started(real, app, cfg)
    try:
        item, _ = await service.create(real, cfg, "q", {})
        await eventually(lambda: _is(real, item["id"], "completed"))
        assert (await service.read(real, item["id"]))["attempts"] == 1
    finally:
        await worker.stop()
        await real.close()


async def test_an_idle_server_with_handlers_stops_without_waiting_out_its_grace(settings: Any, database_url: str) -> None:
    """A server running queue handlers stopped at once when idle; it used to wait all of
    graceful_shutdown_ms (a cancelled wait_for in a short nap swallowed the cancellation)."""
    from mainspring.api import create_app

    code = App()

    @code.queue("idle")
    async def handle(item: Any) -> None:
        return None

    patient = settings.model_copy(update={"server": settings.server.model_copy(update={"graceful_shutdown_ms": 30_000, "poll_interval_ms": 1000})})
    server = create_app(patient, store=Store(database_url), registry=code)
    async with server.router.lifespan_context(server):
        await asyncio.sleep(0.3)
        began = time.monotonic()
    assert time.monotonic() - began < 10, "shutdown waited out the grace period"


async def test_a_handler_that_returned_frees_its_slot_while_its_outcome_is_stored(store: Store, cfg: Any, monkeypatch: Any) -> None:
    """The next item's handler starts while the last one's release is still on its way to the store (the lease
    overlaps the release); with every outcome held up, leasing stops at twice the concurrency. (Where a source
    stores outcomes with the next lease in one round trip, the release is that lease: see
    test_a_busy_workers_outcomes_go_with_its_next_lease_in_one_statement.)"""
    from mainspring.interactions import leasing

    monkeypatch.setattr(leasing, "releases_with_lease", lambda store, queue: False)
    store_outcomes = asyncio.Event()
    original = leasing.release_many

    async def held_up(*args: Any, **kwargs: Any) -> Any:
        await store_outcomes.wait()
        return await original(*args, **kwargs)

    monkeypatch.setattr(leasing, "release_many", held_up)
    started_ids: list[str] = []
    app = App()

    @app.queue("q", concurrency=1, batch=1)
    async def handle(item: Any) -> None:
        started_ids.append(item.id)

    made = [(await service.create(store, cfg, "q", {"data": i}))[0]["id"] for i in range(4)]
    worker = await started(store, app, cfg)
    try:
        await eventually(lambda: _started(started_ids, 2))
        await asyncio.sleep(0.3)
        assert started_ids == made[:2]  # two held outcomes: one concurrency's worth more, then no more leases
        store_outcomes.set()
        await eventually(lambda: _started(started_ids, 4))
        for item_id in made:
            await eventually(lambda item_id=item_id: _is(store, item_id, "completed"))
    finally:
        store_outcomes.set()
        await worker.stop()


async def _started(started_ids: list[str], n: int) -> bool:
    return len(started_ids) >= n


async def _runner_with_leased_items(store: Store, cfg: Any, n: int) -> tuple[Worker, Any, list[Any], list[str]]:
    from mainspring.interactions import leasing
    from mainspring.interactions.models import Interaction

    app = App()
    ran: list[str] = []

    @app.queue("idle")
    async def runs_until_stopped(item: Any) -> None:
        ran.append(item.id)
        await asyncio.Event().wait()

    worker = Worker(store, app, cfg, poll_ms=200)
    await worker.start()
    for i in range(n):
        await service.create(store, cfg, "other", {"data": i})
    leased = (await leasing.lease(store, cfg, "other", "w", n)).items
    return worker, worker.runners["idle"], [Interaction.model_validate(item) for item in leased], ran


async def test_an_item_leased_while_the_keeper_reads_the_store_is_not_taken_for_lost(store: Store, cfg: Any, monkeypatch: Any) -> None:
    from mainspring.interactions import worker as worker_module

    worker, runner, (running, leased_meanwhile), ran = await _runner_with_leased_items(store, cfg, 2)
    original = worker_module.data.held_leases

    async def lease_meanwhile(conn: Any, checking: Any) -> Any:
        runner._start(leased_meanwhile)  # the lease loop starts an item while the keeper's read is on its way
        return await original(conn, checking)

    runner._start(running)
    monkeypatch.setattr(worker_module.data, "held_leases", lease_meanwhile)
    try:
        runner._cancel_lost(*await runner._still_held())
        await eventually(lambda: _started(ran, 2))
        for item in (running, leased_meanwhile):
            entry = runner.inflight[int(item.id)]
            assert not entry.given_up and entry.task is not None and not entry.task.cancelling(), item.id
    finally:
        await worker.stop(False)


async def test_an_item_given_up_before_its_handler_ran_is_forgotten_and_never_run(store: Store, cfg: Any) -> None:
    worker, runner, (item, other), ran = await _runner_with_leased_items(store, cfg, 2)
    try:
        runner._start(item)
        runner._start(other)
        runner._cancel_lost(set(), {int(item.id)})  # lost while still queued: no handler loop has taken it yet
        assert int(item.id) not in runner.inflight
        await eventually(lambda: _started(ran, 1))
        await asyncio.sleep(0.05)
        assert ran == [other.id]
    finally:
        await worker.stop(False)


async def _completed_events(store: Store) -> dict[str, int]:
    from sqlalchemy import text

    async with store.read() as conn:
        rows = (await conn.execute(text("SELECT subject_id, count(*) FROM events WHERE type = 'interaction.completed' GROUP BY subject_id"))).all()
    return {str(s): int(n) for s, n in rows}


async def test_a_busy_workers_outcomes_go_with_its_next_lease_in_one_statement(store: Store, cfg: Any, engine: str, monkeypatch: Any) -> None:
    """On PostgreSQL a worker of an unlimited queue sends the outcomes that wait with its next lease, one statement
    for both (one round trip, one commit); each item is completed once, with one event. A combined call that fails
    leaves its outcomes to be sent again."""
    if engine != "postgres":
        pytest.skip("SQLite's one writer has no round trip to save")
    from mainspring.interactions import data

    combined = data.complete_then_take_alone
    completed_together: list[int] = []
    failed_once = False

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal failed_once
        if not failed_once and completed_together:
            failed_once = True
            raise ConnectionResetError("the store went away mid-call")
        done, got = await combined(*args, **kwargs)
        completed_together.extend(done)
        return done, got

    monkeypatch.setattr(data, "complete_then_take_alone", counted)
    app = App()

    @app.queue("q", concurrency=4, batch=4)
    async def handle(item: Any) -> Any:
        await asyncio.sleep(0.001)
        return {"n": item.data}

    made = [(await service.create(store, cfg, "q", {"data": i}))[0]["id"] for i in range(40)]
    worker = await started(store, app, cfg)
    try:
        for item_id in made:
            await eventually(lambda item_id=item_id: _is(store, item_id, "completed"))
    finally:
        await worker.stop()
    assert failed_once and len(completed_together) > len(made) // 2
    assert await _completed_events(store) == dict.fromkeys(made, 1)
    for item_id in made:
        assert (await service.read(store, item_id))["attempts"] == 1
