"""Rate limits are sliding windows (issue 35, item 6): no span of ``per_ms`` ever sees more than ``count`` lease
starts, wherever the wall clock's second boundaries fall — for the queue's ``rate_limit`` and each owner's
``per_owner.rate_limit``, through the transaction (both engines) and the one-call fair lease (PostgreSQL)."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import text

from mainspring.config import Settings
from mainspring.interactions import leasing, outcomes, service
from mainspring.store import ManualClock, Store
from mainspring.store.migrate import migrate
from tests.conftest import upgrade_to

# 690 ms into a second of the wall clock: a fixed window would open a new one 310 ms later.
EDGE = 1_800_000_000_690

QUEUE_RATE = {"rate_limit": {"count": 5, "per_ms": 1000}}
OWNER_RATE = {"owner_by": "user", "per_owner": {"rate_limit": {"count": 5, "per_ms": 1000}}}
FAIR_OWNER_RATE = {**OWNER_RATE, "fair": True}
FAIR_QUEUE_RATE = {"owner_by": "user", "fair": True, **QUEUE_RATE}
SETTINGS = {"queue": QUEUE_RATE, "owner": OWNER_RATE, "fair owner": FAIR_OWNER_RATE, "fair queue": FAIR_QUEUE_RATE}


async def queue_at_the_edge(store: Store, settings: Settings, clock: ManualClock, limits: dict[str, Any], items: int) -> None:
    clock.set(EDGE)
    await service.put_queue(store, settings.interactions, "q", limits)
    await service.create_many(store, settings.interactions, "q", [{"user": "alice"} for _ in range(items)])


async def take(store: Store, settings: Settings, n: int) -> list[dict[str, Any]]:
    taken = (await leasing.lease(store, settings.interactions, "q", "w", n)).items
    # Finished at once: a rate limit counts starts, whatever ends them.
    await leasing.release_many(store, "q", [(int(i["id"]), i["lease"]["token"], outcomes.Complete(None)) for i in taken])
    return taken


@pytest.mark.parametrize("limits", SETTINGS.values(), ids=SETTINGS.keys())
async def test_no_span_of_per_ms_sees_more_than_count_starts_across_a_wall_clock_second(
    store: Store, settings: Settings, clock: ManualClock, limits: dict[str, Any]
) -> None:
    await queue_at_the_edge(store, settings, clock, limits, 20)
    assert len(await take(store, settings, 1)) == 1  # the fair queue's first lease: the next are one call on PostgreSQL
    clock.advance(10)
    assert len(await take(store, settings, 10)) == 4
    clock.advance(300)  # past the wall clock's second, 310 ms after the first start
    assert await take(store, settings, 10) == [], "a fixed window let 5 more start 310 ms after the first 5"
    clock.advance(689)
    assert await take(store, settings, 10) == [], "999 ms after the first start"
    clock.advance(1)
    assert len(await take(store, settings, 10)) == 1, "the first start has left the window, the other four not yet"
    clock.advance(10)
    assert len(await take(store, settings, 10)) == 4


@pytest.mark.parametrize("limits", SETTINGS.values(), ids=SETTINGS.keys())
async def test_random_leases_never_start_more_than_count_in_any_span_and_use_the_whole_rate(
    store: Store, settings: Settings, clock: ManualClock, limits: dict[str, Any]
) -> None:
    await queue_at_the_edge(store, settings, clock, limits, 200)
    rng = random.Random(35)
    starts: list[int] = []
    while clock.now_ms() < EDGE + 10_000:
        starts += [clock.now_ms()] * len(await take(store, settings, rng.randint(1, 4)))
        clock.advance(rng.choice([0, 1, 7, 50, 130, 333]))
    busiest = max(sum(1 for s in starts if t <= s < t + 1000) for t in starts)
    assert busiest <= 5, f"{busiest} starts in one second"
    assert len(starts) >= 45, f"only {len(starts)} starts in 10 s at 5 a second"


async def test_a_limited_lease_says_to_look_again_when_the_first_start_leaves_the_window(
    store: Store, settings: Settings, clock: ManualClock
) -> None:
    await queue_at_the_edge(store, settings, clock, QUEUE_RATE, 10)
    assert len(await take(store, settings, 2)) == 2
    clock.advance(400)
    leased = await leasing.lease(store, settings.interactions, "q", "w", 10)
    assert len(leased.items) == 3 and leased.next_due == EDGE + 1000


async def test_the_owners_windows_are_their_own(store: Store, settings: Settings, clock: ManualClock) -> None:
    cfg = settings.interactions
    clock.set(EDGE)
    await service.put_queue(store, cfg, "q", OWNER_RATE)
    await service.create_many(store, cfg, "q", [{"user": u} for u in ("alice", "bob") for _ in range(10)])
    await service.create_many(store, cfg, "q", [{"user": "alice"} for _ in range(5)])
    assert Counter(i["user"] for i in await take(store, settings, 5)) == {"alice": 5}, "alice's items come first"
    clock.advance(400)
    assert Counter(i["user"] for i in await take(store, settings, 10)) == {"bob": 5}
    clock.advance(600)
    assert Counter(i["user"] for i in await take(store, settings, 10)) == {"alice": 5}


def random_log(rng: random.Random, now: int, per_ms: int) -> list[list[int]] | None:
    """A log as leases leave it: times that only grow, some of them out of the window, some ahead of ``now``."""
    if rng.random() < 0.1:
        return None
    at = now - rng.randint(0, 2 * per_ms)
    log = []
    for _ in range(rng.choice([0, 1, 3, 70])):
        at += rng.choice([0, 1, rng.randint(1, max(1, per_ms // 4))])
        if log and log[-1][0] == at:
            log[-1][1] += 1
        else:
            log.append([at, rng.randint(1, 3)])
    return log


async def test_the_stores_rate_functions_count_as_the_lease_does(store: Store, engine: str) -> None:
    """The one-call fair lease (PostgreSQL) keeps its logs with migration interactions_0015's functions; the transaction
    with ``leasing``'s. Both must count alike, cap the log alike, and read it no earlier than its latest start."""
    if engine != "postgres":
        pytest.skip("the functions are PostgreSQL's")
    rng = random.Random(6)
    statement = text(
        "SELECT mainspring_rate_left(CAST(:log AS jsonb), :now, :per, :count), mainspring_rate_free_at(CAST(:log AS jsonb), :now, :per), "
        "mainspring_rate_started(CAST(:log AS jsonb), :now, :n, :per)"
    )
    async with store.read() as conn:
        for _ in range(300):
            now, per_ms, count, n = rng.randint(10**6, 2 * 10**6), rng.choice([1, 10, 1000]), rng.randint(1, 100), rng.randint(1, 5)
            log = random_log(rng, now, per_ms)
            params = {"log": None if log is None else json.dumps(log), "now": now, "per": per_ms, "count": count, "n": n}
            left, free_at, started = (await conn.execute(statement, params)).one()
            expected = (leasing.rate_left(log, now, per_ms, count), leasing.rate_free_at(log, now, per_ms), leasing.rate_started(log, now, n, per_ms))
            assert (left, free_at, json.loads(started) if isinstance(started, str) else started) == expected, (log, now, per_ms, count, n)
            assert len(expected[2]) <= leasing.RATE_STARTS_KEPT


def test_a_log_at_its_cap_counts_the_oldest_starts_longer_never_fewer() -> None:
    log = [[t, 1] for t in range(1000, 1000 + leasing.RATE_STARTS_KEPT)]
    capped = leasing.rate_started(log, 1000 + leasing.RATE_STARTS_KEPT, 1, 10_000)
    assert len(capped) == leasing.RATE_STARTS_KEPT and capped[0] == [1001, 2]
    for now in range(1000, 12_000, 37):
        assert leasing.rate_left(capped, now, 10_000, 100) <= leasing.rate_left([*log, [1000 + leasing.RATE_STARTS_KEPT, 1]], now, 10_000, 100)


async def test_a_window_in_force_at_the_upgrade_is_kept_as_starts_at_its_beginning(blank_database_url: str, settings: Settings) -> None:
    cfg = settings.interactions
    clock = ManualClock(EDGE)
    store = Store(blank_database_url, clock=clock)
    try:
        await store.run_sync(upgrade_to("interactions_0014"))
        begun = EDGE - 690
        async with store.transaction() as tx:
            await tx.execute(text(
                "INSERT INTO interaction_queues (name, lease_ms, error_delay_ms, max_attempts, created_at, updated_at, rate_limit_count, "
                "rate_limit_per_ms, owner_by, per_owner_rate_count, per_owner_rate_per_ms, window_start, window_count) "
                "VALUES ('q', 30000, 0, 5, 0, 0, 5, 1000, 'user', 3, 1000, :begun, 4)"
            ), {"begun": begun})
            await tx.execute(text("INSERT INTO interaction_owners (queue, owner, window_start, window_count, turn) VALUES ('q', 'alice', :begun, 3, 0)"),
                             {"begun": begun})
        await migrate(store)
        await service.create_many(store, cfg, "q", [{"user": u} for u in ("alice", "bob") for _ in range(3)])
        assert [i["user"] for i in (await leasing.lease(store, cfg, "q", "w", 10)).items] == ["bob"], "one left of the queue's 5, none of alice's 3"
        clock.set(begun + 1000)
        assert Counter(i["user"] for i in (await leasing.lease(store, cfg, "q", "w", 10)).items) == {"alice": 3, "bob": 1}
    finally:
        await store.close()


def test_a_rate_log_longer_than_it_keeps_loses_no_start_from_its_count() -> None:
    """The log of an owner's or a queue's starts keeps RATE_STARTS_KEPT entries: the oldest are merged into the
    next, so the window still counts every start in it."""
    starts = None
    for n in range(leasing.RATE_STARTS_KEPT + 5):
        starts = leasing.rate_started(starts, 1_000 + n, 1, 60_000)
    assert starts is not None and len(starts) == leasing.RATE_STARTS_KEPT
    assert sum(k for _, k in starts) == leasing.RATE_STARTS_KEPT + 5
