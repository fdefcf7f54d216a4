"""The fair lease has two implementations that must pick alike: the transaction's (``leasing._lease_once`` with
``_fair_shares``, both engines) and, on PostgreSQL, the one-call function ``mainspring_interactions_fair_lease``
(migration interactions_0014). Random scenarios — owners, weights, per-owner and queue limits, priorities, rate
windows, pauses, retries, expired leases — run step by step on two queues of one database with the same settings,
items and clock, one leased only through the transaction and the other through the function; every lease must take
the same items in the same order and answer the same next look, and the queues must end in the same state (owners'
turns, rate windows and next due times, the queue's fair clock and window, every item).

Leases the function hands back to the transaction (expired leases to sweep, priorities that age) are the
transaction's on both sides: such scenarios check the hand-back itself."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from mainspring.config import Settings
from mainspring.interactions import leasing, outcomes, service
from mainspring.interactions.settings import InteractionsSettings
from mainspring.store import ManualClock, Store

_queues = itertools.count()
OWNERS = ("ann", "bo", "cy", "dee")

rate = st.none() | st.fixed_dictionaries({"count": st.integers(1, 6), "per_ms": st.sampled_from([1_000, 2_500])})
queue_settings = st.fixed_dictionaries({
    "owner_by": st.just("user"),
    "fair": st.just(True),
    "weights": st.dictionaries(st.sampled_from(OWNERS), st.integers(1, 5), max_size=3),
    "per_owner": st.fixed_dictionaries({"concurrency": st.none() | st.integers(1, 4), "rate_limit": rate}),
    "concurrency": st.none() | st.integers(1, 8),
    "rate_limit": rate,
    # Priorities that age are the transaction's only (the function hands such a queue back): rarely.
    "priority_aging_ms": st.sampled_from([None] * 11 + [1_000]),
    "lease_ms": st.sampled_from([1_000, 4_000]),
    "error_delay_ms": st.sampled_from([0, 700]),
    "max_attempts": st.integers(1, 3),
    "processing_timeout_ms": st.none() | st.just(2_500),
})
create = st.tuples(st.just("create"), st.sampled_from(OWNERS), st.integers(0, 2), st.sampled_from([0, 0, 0, 600, 3_000]), st.integers(1, 5))
lease = st.tuples(st.just("lease"), st.integers(1, 6))
release = st.tuples(st.just("release"), st.integers(0, 9), st.sampled_from(["complete", "complete", "retry", "fail"]))
advance = st.tuples(st.just("advance"), st.sampled_from([100, 600, 1_000, 2_600, 5_000]))
pause = st.tuples(st.just("pause"), st.sampled_from([True, False, False]))
reweigh = st.tuples(st.just("reweigh"), st.dictionaries(st.sampled_from(OWNERS), st.integers(1, 5), max_size=3))
# Each kind of step in proportion: leases most, creates and releases often, the rest now and then.
STEP_MIX = {create: 3, lease: 5, release: 3, advance: 2, pause: 1, reweigh: 1}
any_step = st.sampled_from([kind for kind, weight in STEP_MIX.items() for _ in range(weight)]).flatmap(lambda kind: kind)
steps = st.tuples(st.lists(create, min_size=1, max_size=4), st.lists(any_step, min_size=6, max_size=40)).map(lambda parts: parts[0] + parts[1])


async def lease_by(store: Store, cfg: InteractionsSettings, queue: str, function: bool, most: int) -> leasing.Leased:
    """A lease of ``queue`` through the function (``function``) or the transaction, whatever the store learnt of it
    before (the function is tried when the store knows the queue as fair and owned without aging)."""
    leasing._fair_here(store)[queue] = function
    return await leasing.lease(store, cfg, queue, "w", most)


def picked(leased: leasing.Leased) -> list[tuple[Any, ...]]:
    return [(i["data"], i["user"], i["attempts"], i["lease"]["expires_at"]) for i in leased.items]


async def state_of(store: Store, queue: str) -> dict[str, Any]:
    """What a lease leaves behind that a later lease reads."""
    async with store.read() as conn:
        owners = (await conn.execute(text(
            "SELECT owner, window_start, window_count, turn, next_due FROM interaction_owners WHERE queue = :q ORDER BY owner"), {"q": queue})).all()
        row = (await conn.execute(text("SELECT fair_clock, window_start, window_count FROM interaction_queues WHERE name = :q"), {"q": queue})).one()
        items = (await conn.execute(text(
            "SELECT data, state, attempts, next_processing, leased_at, lease_expires_at, finished_at, error FROM interactions "
            "WHERE queue = :q ORDER BY id"), {"q": queue})).all()
    return {"owners": [tuple(o) for o in owners], "queue": tuple(row), "items": [tuple(i) for i in items]}


# 60 scenarios of up to 44 steps, each step twice on PostgreSQL: ~35 s on a quiet machine, several times that under
# the suite's load — a timeout mid-scenario reads to hypothesis as a flaky failure.
@pytest.mark.timeout(600)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(configured=queue_settings, script=steps)
async def test_the_fair_lease_function_picks_as_the_transaction_does(
    engine: str, store: Store, settings: Settings, clock: ManualClock, configured: dict[str, Any], script: list[tuple[Any, ...]]
) -> None:
    if engine != "postgres":
        pytest.skip("the fair lease function is PostgreSQL's")
    cfg = settings.interactions
    n = next(_queues)
    sides = {False: f"tx{n}", True: f"fn{n}"}
    for queue in sides.values():
        await service.put_queue(store, cfg, queue, configured)
    held: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    tag = itertools.count()
    for step in script:
        kind = step[0]
        if kind == "create":
            _, owner, priority, delay, count = step
            specs = [{"user": owner, "priority": priority, "data": next(tag), "due_at": clock.now_ms() + delay} for _ in range(count)]
            for queue in sides.values():
                await service.create_many(store, cfg, queue, specs)
        elif kind == "lease":
            answers = {function: await lease_by(store, cfg, queue, function, step[1]) for function, queue in sides.items()}
            assert picked(answers[True]) == picked(answers[False]), f"{step}: the function and the transaction took differently"
            assert answers[True].next_due == answers[False].next_due, f"{step}: a different next look"
            for function, leased in answers.items():
                held[function].extend(leased.items)
        elif kind == "release":
            _, index, outcome = step
            if not held[False]:
                continue
            index %= len(held[False])
            chosen = {"complete": outcomes.Complete(None), "retry": outcomes.Retry("again"), "fail": outcomes.Fail("no")}[outcome]
            # A lease that expired meanwhile is not held any more: on both sides alike, its release changes nothing.
            for function, queue in sides.items():
                item = held[function].pop(index)
                await leasing.release_many(store, queue, [(int(item["id"]), item["lease"]["token"], chosen)])
        elif kind == "advance":
            clock.advance(step[1])
        elif kind == "pause":
            for queue in sides.values():
                await service.pause_queue(store, cfg, queue, step[1])
        else:
            for queue in sides.values():
                await service.put_queue(store, cfg, queue, {**configured, "weights": step[1]})
        assert await state_of(store, sides[True]) == await state_of(store, sides[False]), f"after {step}"
