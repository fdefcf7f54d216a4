"""The worker's handler loops: items run by long-lived loops (no task per item), and what each item still gets
on its own — its handler at once beside the others, its own cancellation and timeout, its own log ids — and the
items a store answers, handed to handlers without being validated again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mainspring.app import App
from mainspring.config import Settings
from mainspring.core import logs
from mainspring.interactions import leasing, service
from mainspring.interactions.models import Interaction
from mainspring.interactions.sources import stored_interaction
from mainspring.interactions.worker import Worker
from mainspring.store import Store
from tests.interactions.test_worker import _is, eventually, status


@pytest.fixture
def cfg(settings: Settings) -> Any:
    return settings.interactions


async def started(store: Store, registry: App, cfg: Any) -> Worker:
    worker = Worker(store, registry, cfg, poll_ms=200)
    await worker.start()
    return worker


async def test_the_handlers_of_one_lease_all_run_at_once_up_to_the_concurrency(store: Store, cfg: Any) -> None:
    """Each handler waits until all of them have started: it finishes only if every item of the batch gets a
    handler loop of its own while the others wait."""
    app = App()
    n = 40
    arrived = 0
    everyone = asyncio.Event()

    @app.queue("q", concurrency=n, batch=n)
    async def meet(item: Any) -> None:
        nonlocal arrived
        arrived += 1
        if arrived == n:
            everyone.set()
        await everyone.wait()

    await service.create_many(store, cfg, "q", [{"data": i} for i in range(n)])
    worker = await started(store, app, cfg)
    try:
        await asyncio.wait_for(everyone.wait(), 10)
        await eventually(lambda: _counted(store, cfg, "q", "completed", n))
    finally:
        await worker.stop()


async def _counted(store: Store, cfg: Any, queue: str, status: str, n: int) -> bool:
    return bool((await service.get_queue(store, cfg, queue))["counts"][status] == n)


async def test_after_an_items_handler_is_cancelled_its_loop_runs_the_next_item(store: Store, cfg: Any) -> None:
    app = App()
    running = asyncio.Event()
    cancelled = asyncio.Event()

    @app.queue("q", concurrency=1, batch=1)  # one loop: the next item runs where the cancelled one ran
    async def handle(item: Any) -> Any:
        if item.data == "long":
            running.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return "done"

    worker = await started(store, app, cfg)
    try:
        first, _ = await service.create(store, cfg, "q", {"data": "long"})
        await asyncio.wait_for(running.wait(), 10)
        await service.cancel(store, first["id"])
        await asyncio.wait_for(cancelled.wait(), 5)
        second, _ = await service.create(store, cfg, "q", {"data": "short"})
        await eventually(lambda: _is(store, second["id"], "completed"))
        assert await status(store, first["id"]) == "cancelled"
        runner = worker.runners["q"]
        assert all(not loop.cancelling() for loop in runner._loops)
    finally:
        await worker.stop()


async def test_a_handler_that_swallows_its_cancellation_leaves_its_loop_as_it_was(store: Store, cfg: Any) -> None:
    """A handler that catches its cancellation and returns: its loop takes the cancellation back all the same
    (a loop left cancelling would end at the next item's cancellation), and runs the next items."""
    app = App()
    running = asyncio.Event()
    swallowed = asyncio.Event()

    @app.queue("q", concurrency=1, batch=1, timeout_ms=300)
    async def handle(item: Any) -> Any:
        if item.data == "stubborn":
            running.set()
            try:
                await asyncio.sleep(0.2)
            except asyncio.CancelledError:
                swallowed.set()
            return "ignored the cancel"
        await asyncio.sleep(60)  # past its timeout

    worker = await started(store, app, cfg)
    try:
        first, _ = await service.create(store, cfg, "q", {"data": "stubborn"})
        await asyncio.wait_for(running.wait(), 10)
        await service.cancel(store, first["id"])
        await asyncio.wait_for(swallowed.wait(), 5)
        second, _ = await service.create(store, cfg, "q", {"data": "slow"})
        await eventually(lambda: _error_of(store, second["id"], "processing timed out after 300 ms"))
        (loop,) = worker.runners["q"]._loops
        assert loop.cancelling() == 0
    finally:
        await worker.stop(graceful=False)


async def _error_of(store: Store, item_id: str, error: str) -> bool:
    return bool((await service.read(store, item_id))["error"] == error)


async def test_a_handler_that_raises_cancelled_error_itself_leaves_its_item_to_its_lease_and_its_loop_goes_on(store: Store, cfg: Any) -> None:
    app = App()

    @app.queue("q", concurrency=1, batch=1)
    async def handle(item: Any) -> Any:
        if item.data == "gives up":
            raise asyncio.CancelledError  # nothing cancelled it: as a cancellation, its item is not released
        return "done"

    worker = await started(store, app, cfg)
    try:
        first, _ = await service.create(store, cfg, "q", {"data": "gives up"})
        second, _ = await service.create(store, cfg, "q", {"data": "fine"})
        await eventually(lambda: _is(store, second["id"], "completed"))
        assert await status(store, first["id"]) == "processing"  # until its lease expires
        runner = worker.runners["q"]
        assert int(first["id"]) not in runner.inflight and len(runner._loops) == 1
    finally:
        await worker.stop()


async def test_a_timed_out_handler_leaves_its_loop_running_the_next_items(store: Store, cfg: Any) -> None:
    app = App()

    @app.queue("q", concurrency=1, batch=1, timeout_ms=100)
    async def handle(item: Any) -> Any:
        if item.data == "slow":
            await asyncio.sleep(60)
        return item.data

    worker = await started(store, app, cfg)
    try:
        slow, _ = await service.create(store, cfg, "q", {"data": "slow"})
        await eventually(lambda: _error_of(store, slow["id"], "processing timed out after 100 ms"))
        quick = [(await service.create(store, cfg, "q", {"data": i}))[0]["id"] for i in range(3)]
        for item_id in quick:
            await eventually(lambda item_id=item_id: _is(store, item_id, "completed"))
    finally:
        await worker.stop(graceful=False)


async def test_each_items_log_ids_are_its_own_and_nothing_a_previous_handler_bound(store: Store, cfg: Any) -> None:
    app = App()
    seen: list[dict[str, Any]] = []

    @app.queue("q", concurrency=1, batch=10)  # one loop runs every item, one after another
    async def handle(item: Any) -> None:
        seen.append(dict(logs.current()))
        logs.bind(customer=f"c{item.data}")

    made = [item["id"] for item, _ in await service.create_many(store, cfg, "q", [{"data": i} for i in range(3)])]
    worker = await started(store, app, cfg)
    try:
        await eventually(lambda: _counted(store, cfg, "q", "completed", 3))
        assert [(s.get("queue"), s.get("interaction_id"), s.get("customer")) for s in seen] == [("q", i, None) for i in made]
    finally:
        await worker.stop()


async def test_a_graceful_stop_waits_until_the_finished_items_outcomes_are_stored(store: Store, cfg: Any, monkeypatch: Any) -> None:
    app = App()
    held_up = asyncio.Event()
    releasing = asyncio.Event()
    original = leasing.release_many

    async def slow_release(*args: Any, **kwargs: Any) -> Any:
        releasing.set()
        await held_up.wait()
        return await original(*args, **kwargs)

    monkeypatch.setattr(leasing, "release_many", slow_release)

    @app.queue("q")
    async def handle(item: Any) -> str:
        return "done"

    item, _ = await service.create(store, cfg, "q", {})
    worker = await started(store, app, cfg)
    await asyncio.wait_for(releasing.wait(), 10)
    stopping = asyncio.create_task(worker.stop(graceful=True, timeout_ms=10_000))
    await asyncio.sleep(0.2)
    assert not stopping.done()
    held_up.set()
    await asyncio.wait_for(stopping, 10)
    assert await status(store, item["id"]) == "completed"


async def test_an_item_the_store_leased_reaches_its_handler_as_the_validated_interaction(store: Store, cfg: Any) -> None:
    parent, _ = await service.create(store, cfg, "q", {"data": {"a": [1, 2]}, "name": "n", "priority": 3, "user": "u"})
    await service.create(store, cfg, "q", {"parent_id": int(parent["id"]), "name": "child", "data": None})
    built = []
    for fields in (await leasing.lease(store, cfg, "q", "w", 10)).items:
        checked = Interaction.model_validate(fields)
        item = stored_interaction(fields)
        assert type(item) is Interaction and type(item.lease) is type(checked.lease)
        assert item == checked and item.model_dump() == checked.model_dump() and item.model_fields_set == checked.model_fields_set
        built.append(item)
    first, second = built
    first.status = "changed"  # a handler may change its item, as it could a validated one: that one alone
    assert first.model_dump()["status"] == "changed" and second.status == "processing"
    assert first.model_fields_set == second.model_fields_set == set(Interaction.model_fields)


def test_an_item_with_an_error_detail_or_other_fields_is_validated() -> None:
    leased = {"id": "1", "queue": "q", "parent_id": None, "name": None, "message_id": None, "channel": None, "user": None,
              "source": None, "priority": 0, "data": None, "result": None, "error": "boom", "status": "processing",
              "next_processing": None, "attempts": 2, "created_at": "t", "updated_at": "t",
              "lease": {"token": "x", "expires_at": "t"}, "trace_parent": None,
              "error_detail": {"type": "ValueError", "message": "boom", "traceback": "…"}}
    assert type(stored_interaction(leased).error_detail).__name__ == "ErrorDetail"
    with pytest.raises(ValueError, match="status"):  # a field less: validated
        stored_interaction({k: v for k, v in leased.items() if k not in ("status", "error_detail")})
    with pytest.raises(ValueError, match="lease"):
        stored_interaction({**leased, "error_detail": None, "lease": "x"})
