"""The dispatcher against the store: thresholds, carry, max_wait, runtime settings, one flush only."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select

from mainspring.batching import data
from mainspring.batching.cafe import claim_once
from mainspring.batching.dispatcher import DoubleFlush, dispatch_batcher
from mainspring.batching.models import BatcherSettingsIn, TaskIn
from mainspring.batching.service import put_batcher as put_batcher_service
from mainspring.batching.service import submit_task
from mainspring.batching.tables import batch_packages, batch_tasks
from mainspring.core.tables import events
from mainspring.store import Store
from tests.batching.conftest import put_batcher, settle, statuses, submit, submit_pair, wait_status


async def test_at_max_size_the_oldest_complete_groups_are_packed_and_a_lone_task_stays(client) -> None:
    await put_batcher(client)
    await submit(client, "x-en", "x", "en")
    ids = await submit_pair(client, "a") + await submit_pair(client, "b") + await submit_pair(client, "c")
    # Whether the dispatcher looked at six or seven tasks, only whole pairs leave, never the lone task.
    packed = await wait_status(client, ids[:4], "packed")
    assert len({t["package_id"] for t in packed}) == 1
    assert (await statuses(client, ["x-en"])) == {"x-en": "pending"}


async def test_with_carry_an_incomplete_group_waits_for_its_partner(client, clock) -> None:
    await put_batcher(client, incomplete_group="carry")
    pair = await submit_pair(client, "a")
    await submit(client, "b-en", "b", "en")
    clock.advance(5000)
    await wait_status(client, pair, "packed")
    await settle()
    assert (await statuses(client, ["b-en"])) == {"b-en": "pending"}
    clock.advance(10_000)
    await submit(client, "b-ru", "b", "ru")
    clock.advance(5000)
    both = await wait_status(client, ["b-en", "b-ru"], "packed")
    assert both[0]["package_id"] == both[1]["package_id"]


async def test_with_carry_a_task_still_incomplete_at_max_wait_is_rejected(client, clock) -> None:
    await put_batcher(client, incomplete_group="carry", max_wait_ms=20_000)
    await submit_pair(client, "a")
    await submit(client, "b-en", "b", "en")
    clock.advance(5000)
    await settle()
    assert (await statuses(client, ["b-en"])) == {"b-en": "pending"}
    clock.advance(15_000)
    rejected = await wait_status(client, ["b-en"], "rejected")
    assert rejected[0]["reason"] == "incomplete_group"


async def test_a_lone_task_never_reaching_min_size_is_rejected_at_max_wait(client, clock) -> None:
    await put_batcher(client)
    await submit(client, "lone", "g", "en")
    clock.advance(29_999)
    await settle()
    assert (await statuses(client, ["lone"])) == {"lone": "pending"}
    clock.advance(1)
    assert (await wait_status(client, ["lone"], "rejected"))[0]["reason"] == "incomplete_group"


async def test_a_lone_complete_group_is_packed_at_max_wait(client, clock) -> None:
    await put_batcher(client, min_size=3, group_size=1)
    await submit(client, "lone", "g", "en")
    clock.advance(30_000)
    await wait_status(client, ["lone"], "packed")


async def test_changed_settings_apply_to_the_next_batch_on_the_running_server(client, clock) -> None:
    await put_batcher(client)
    await put_batcher(client, max_size=2)
    ids = await submit_pair(client, "a")
    await wait_status(client, ids, "packed")  # no timer: the pair is max_size now


async def test_concurrent_dispatcher_rounds_on_several_stores_flush_each_task_once(database_url, clock, store) -> None:
    others = [Store(database_url, clock=clock, pool_size=3, sqlite_synchronous="NORMAL") for _ in range(3)]
    stores = [store, *others]
    try:
        # carry: a round may flush while a pair is half submitted (the clock jumps past the linger between
        # two submits); that half waits for its partner instead of being rejected, which is not this test's point.
        await put_batcher_service(store, "books", BatcherSettingsIn(min_size=2, max_size=6, linger_ms=50, group_size=2, incomplete_group="carry"))

        async def rounds(s: Store) -> None:
            for _ in range(30):
                await dispatch_batcher(s, "books")
                await asyncio.sleep(0)

        async def feed() -> None:
            for i in range(60):
                for member in ("en", "ru"):
                    await submit_task(store, "books", TaskIn(id=f"{i}-{member}", group=str(i), member=member, content=f"{i}{member}"))
                if i % 7 == 0:
                    clock.advance(60)

        await asyncio.gather(feed(), *(rounds(s) for s in stores))
        for _ in range(2):  # a last max_size flush may leave a remainder with a timer of its own
            clock.advance(100)
            await dispatch_batcher(store, "books")
        async with store.read() as conn:
            tasks = (await conn.execute(select(batch_tasks.c.status, batch_tasks.c.package_id, batch_tasks.c.group))).all()
            sizes = dict((await conn.execute(select(batch_packages.c.id, batch_packages.c.size))).tuples().all())
            members = dict(
                (await conn.execute(
                    select(batch_tasks.c.package_id, func.count()).group_by(batch_tasks.c.package_id)
                )).tuples().all()
            )
        assert {t.status for t in tasks} == {"packed"}
        assert all(members[p] == size for p, size in sizes.items())
        assert sum(sizes.values()) == 120
        by_group: dict[str, set[str]] = {}
        for t in tasks:
            by_group.setdefault(t.group, set()).add(t.package_id)
        assert all(len(p) == 1 for p in by_group.values())  # a pair never split
    finally:
        for s in others:
            await s.close()


async def submit_one_by_one_then_end_the_timer(store: Store, clock, max_size: int, group: str,
                                               books: list[tuple[str, str, str]]) -> tuple[list, list]:
    """Submit ``(id, member, content)`` books of one group with a dispatcher round after each, let the linger
    timer end, and answer the batcher's tasks and its packages (oldest first)."""
    await put_batcher_service(store, "books", BatcherSettingsIn(min_size=2, max_size=max_size, linger_ms=5000,
                                                                max_wait_ms=30_000, group_size=2, incomplete_group="reject"))
    for task_id, member, content in books:
        await submit_task(store, "books", TaskIn(id=task_id, group=group, member=member, content=content))
        await dispatch_batcher(store, "books")
    clock.advance(5000)
    await dispatch_batcher(store, "books")
    async with store.read() as conn:
        tasks = (await conn.execute(select(batch_tasks).where(batch_tasks.c.batcher == "books"))).all()
        packages = (await conn.execute(select(batch_packages).order_by(batch_packages.c.seq))).all()
    return list(tasks), list(packages)


async def test_a_groups_next_version_completed_by_reissue_in_the_same_round_goes_in_a_later_package(store, clock) -> None:
    # The reissue property's found case: pair g1 at version 1, then only its English book changes. When
    # the linger timer ends, version 1 and version 2 (completed by reissuing the Russian book) leave in one
    # round: two packages, version 1 claimed first, each task in exactly one of them.
    tasks, packages = await submit_one_by_one_then_end_the_timer(
        store, clock, 6, "g1", [("t0", "en", "g1 en a"), ("t1", "ru", "g1 ru a"), ("t2", "en", "g1 en b")])
    placed = {t.id: (t.status, t.version, t.package_id, t.reissued) for t in tasks}
    first, second = (p.id for p in packages)
    assert placed == {
        "t0": ("packed", 1, first, False),
        "t1": ("packed", 1, first, False),
        "t2": ("packed", 2, second, False),
        "g1:ru:v2": ("packed", 2, second, True),
    }
    assert [p.size for p in packages] == [2, 2]
    claimed = [await claim_once(store, "books", "w1", None) for _ in range(2)]
    assert [p["id"] for p in claimed if p] == [first, second]


async def test_a_member_reissued_for_two_versions_in_one_round_repeats_its_stored_content_twice(store, clock) -> None:
    # The pair went out at once (max_size 2); the English book then changed twice before the next timer
    # ended. One round completes versions 2 and 3 by reissuing the Russian book twice, from its stored task.
    tasks, packages = await submit_one_by_one_then_end_the_timer(
        store, clock, 2, "g", [("t0", "en", "a"), ("t1", "ru", "a"), ("t2", "en", "b"), ("t3", "en", "c")])
    order = [p.id for p in packages]
    placed = {t.id: (t.version, order.index(t.package_id), t.content) for t in tasks}
    assert placed == {"t0": (1, 0, "a"), "t1": (1, 0, "a"), "t2": (2, 1, "b"), "g:ru:v2": (2, 1, "a"),
                      "t3": (3, 2, "c"), "g:ru:v3": (3, 2, "a")}


async def test_a_reissue_repeats_only_content_whose_task_is_still_stored_each_line_once(store) -> None:
    """What a reissue may repeat (the group's log as the planner reads it): a member's line whose task is gone
    (removed by retention) is no content to repeat, and every line is read once, however many tasks the batcher
    holds."""
    await put_batcher_service(store, "books", BatcherSettingsIn(min_size=2, max_size=2, linger_ms=5000, max_wait_ms=30_000,
                                                                group_size=2, incomplete_group="reject"))
    for task_id, group, member in (("g-en", "g", "en"), ("g-ru", "g", "ru"), ("h-en", "h", "en"), ("h-ru", "h", "ru")):
        await submit_task(store, "books", TaskIn(id=task_id, group=group, member=member, content=task_id))
    async with store.transaction() as tx:
        await tx.execute(batch_tasks.delete().where(batch_tasks.c.id == "g-ru"))
    async with store.transaction() as tx:
        logs = await data.group_logs(tx, "books", ["g"])
    assert [(line.member, line.version, line.task_id) for line in logs["g"].accepted] == [("en", 1, "g-en")]
    assert logs["g"].taken == {("en", 1), ("ru", 1)}


async def test_a_round_that_finds_a_task_no_longer_pending_when_it_packs_is_rolled_back(store, monkeypatch) -> None:
    """The pack moves only tasks still pending: one another writer took after the round read it (here in the round's
    own transaction, the same on both engines) makes the whole round roll back — no package, no event, the other
    task still pending — rather than put that task in a second package."""
    await put_batcher_service(store, "books", BatcherSettingsIn(min_size=2, max_size=2, linger_ms=5000, max_wait_ms=30_000,
                                                                group_size=2, incomplete_group="reject"))
    for member in ("en", "ru"):
        await submit_task(store, "books", TaskIn(id=f"g-{member}", group="g", member=member, content=member))
    read = data.pending_tasks

    async def read_then_lose_the_first(conn, batcher, limit=None):
        pending = await read(conn, batcher, limit)
        await conn.execute(batch_tasks.update().where(batch_tasks.c.seq == pending[0].seq).values(status="packed", package_id="pkg_other"))
        return pending

    monkeypatch.setattr(data, "pending_tasks", read_then_lose_the_first)
    with pytest.raises(DoubleFlush):
        await dispatch_batcher(store, "books")
    async with store.read() as conn:
        packages = (await conn.execute(select(func.count()).select_from(batch_packages))).scalar_one()
        tasks = dict((await conn.execute(select(batch_tasks.c.id, batch_tasks.c.status))).tuples().all())
        packed_events = (await conn.execute(select(func.count()).select_from(events).where(events.c.type.like("batch.package.%")))).scalar_one()
    assert (packages, packed_events) == (0, 0)
    assert tasks == {"g-en": "pending", "g-ru": "pending"}
