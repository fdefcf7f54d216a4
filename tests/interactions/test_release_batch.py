"""A worker's batch of releases: plain completions take the one-statement path on PostgreSQL, the rest
(parents to wake, children to cancel, lost leases, other outcomes) the transaction path — each item gets
exactly what a release of its own would have given it, with its events."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from mainspring.config import Settings
from mainspring.core import outbox
from mainspring.core.tables import events
from mainspring.interactions import leasing, service
from mainspring.interactions.outcomes import Complete, Repeat, Wait
from mainspring.store import Store


async def made(store: Store, cfg: Any, queue: str, **fields: Any) -> str:
    item, _ = await service.create(store, cfg, queue, fields)
    return str(item["id"])


async def status(store: Store, item_id: str) -> str:
    return str((await service.read(store, item_id))["status"])


async def event_types(store: Store, item_id: str) -> list[str]:
    await outbox.assign_positions(store)
    async with store.read() as conn:
        query = select(events.c.type).where(events.c.subject_kind == "interaction", events.c.subject_id == item_id).order_by(events.c.id)
        return list((await conn.execute(query)).scalars())


async def test_a_batch_of_releases_gives_each_item_its_own_outcome_and_events(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    waiting_parent = await made(store, cfg, "parents")
    (parent_lease,) = (await leasing.lease(store, cfg, "parents", "w", 1)).items
    await leasing.release_many(store, "parents", [(int(waiting_parent), parent_lease["lease"]["token"], Wait())])
    assert await status(store, waiting_parent) == "waiting"

    with_child = await made(store, cfg, "q")
    child_left_open = await made(store, cfg, "kids", parent_id=int(with_child))
    child = await made(store, cfg, "q", parent_id=int(waiting_parent))
    plain_result, plain_none, lost, repeated = [await made(store, cfg, "q") for _ in range(4)]
    taken = {i["id"]: i["lease"]["token"] for i in (await leasing.lease(store, cfg, "q", "w", 10)).items}
    assert set(taken) == {with_child, child, plain_result, plain_none, lost, repeated}

    answers = await leasing.release_many(store, "q", [
        (int(with_child), taken[with_child], Complete()),
        (int(child), taken[child], Complete({"child": True})),
        (int(plain_result), taken[plain_result], Complete({"x": [1, "two"]})),
        (int(plain_none), taken[plain_none], Complete()),
        (int(lost), "not-its-token", Complete()),
        (int(repeated), taken[repeated], Repeat(in_ms=60_000)),
    ])

    assert answers == [True, True, True, True, False, True]
    assert await status(store, with_child) == "completed"
    assert await status(store, child_left_open) == "cancelled"
    assert (await service.read(store, child))["result"] == {"child": True}
    assert await status(store, waiting_parent) == "ready"  # woken by its child's completion
    assert (await service.read(store, plain_result))["result"] == {"x": [1, "two"]}
    assert (await service.read(store, plain_none))["result"] is None
    assert await status(store, lost) == "processing"
    assert await status(store, repeated) == "scheduled"
    for item_id in (with_child, child, plain_result, plain_none):
        assert (await event_types(store, item_id)).count("interaction.completed") == 1, item_id
    assert "interaction.cancelled" in await event_types(store, child_left_open)
    assert "interaction.completed" not in await event_types(store, lost)


async def test_a_release_of_a_lease_already_released_changes_nothing(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    item_id = await made(store, cfg, "q")
    (item,) = (await leasing.lease(store, cfg, "q", "w", 1)).items
    token = item["lease"]["token"]
    assert await leasing.release_many(store, "q", [(int(item_id), token, Complete({"first": 1}))]) == [True]
    assert await leasing.release_many(store, "q", [(int(item_id), token, Complete({"second": 2}))]) == [False]
    assert (await service.read(store, item_id))["result"] == {"first": 1}
    assert (await event_types(store, item_id)).count("interaction.completed") == 1


async def test_a_child_and_its_parent_completed_in_one_batch_both_complete(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    parent = await made(store, cfg, "q")
    child = await made(store, cfg, "q", parent_id=int(parent))
    taken = {i["id"]: i["lease"]["token"] for i in (await leasing.lease(store, cfg, "q", "w", 10)).items}
    answers = await leasing.release_many(store, "q", [(int(parent), taken[parent], Complete()), (int(child), taken[child], Complete())])
    assert answers == [True, True]
    assert await status(store, child) == "completed"
    assert await status(store, parent) == "completed"


async def test_a_batch_completion_wakes_this_servers_waiters_at_its_commit_and_none_when_it_completed_nothing(
    database_url: str, settings: Settings
) -> None:
    # A store that never listens: only its own signals reach its waiters (on PostgreSQL the one-statement
    # completion's NOTIFY would reach them too, later, through the listener).
    store = Store(database_url)
    try:
        cfg = settings.interactions
        item_id = await made(store, cfg, "q")
        (item,) = (await leasing.lease(store, cfg, "q", "w", 1)).items
        finished = store.notifier.waiter(service.finished_channel("q"))
        assert await leasing.release_many(store, "q", [(int(item_id), "not-" + item["lease"]["token"], Complete())]) == [False]
        assert not finished.signalled
        assert await leasing.release_many(store, "q", [(int(item_id), item["lease"]["token"], Complete())]) == [True]
        assert finished.signalled
    finally:
        await store.close()
