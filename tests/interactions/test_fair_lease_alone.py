"""A fair owned queue's leases after its first are one round trip on PostgreSQL (the function of migration
interactions_0014); whatever it cannot decide — settings changed since, a pause, expired leases to sweep first — is
decided by the transaction, as before. The rules themselves are test_fair_leases.py's, on both engines."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from sqlalchemy import text

from mainspring.config import Settings
from mainspring.interactions import leasing, outcomes, service
from mainspring.store import ManualClock, Store

FAIR = {"owner_by": "user", "fair": True, "per_owner": {"concurrency": 2}, "lease_ms": 60_000}


async def taken(store: Store, cfg: Any, n: int, **options: Any) -> list[dict[str, Any]]:
    return (await leasing.lease(store, cfg, "q", "w", n, **options)).items


async def test_a_fair_lease_after_the_first_is_one_round_trip_on_postgres(store: Store, settings: Settings, engine: str) -> None:
    if engine != "postgres":
        pytest.skip("the one-call fair lease is PostgreSQL's")
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", FAIR)
    await service.create_many(store, cfg, "q", [{"user": u} for u in ("alice", "bob", "carol") for _ in range(4)])
    assert len(await taken(store, cfg, 1)) == 1  # learns the queue is fair
    before = store.backend.round_trips  # type: ignore[attr-defined]
    items = await taken(store, cfg, 10)
    assert store.backend.round_trips - before == 1  # type: ignore[attr-defined]
    assert Counter(i["user"] for i in items) == {"alice": 1, "bob": 2, "carol": 2}, "per-owner concurrency 2, alice holds one"


async def test_a_queue_no_longer_fair_is_leased_by_its_new_settings(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", FAIR)
    await service.create_many(store, cfg, "q", [{"user": "flood"} for _ in range(6)])
    await service.create_many(store, cfg, "q", [{"user": "bob"}])
    first = [i["user"] for i in await taken(store, cfg, 1)]
    assert sorted(first + [i["user"] for i in await taken(store, cfg, 1)]) == ["bob", "flood"], "turns, the second one-call"
    await service.put_queue(store, cfg, "q", {"fair": False, "per_owner": {"concurrency": None}})
    assert [i["user"] for i in await taken(store, cfg, 10)] == ["flood"] * 5, "no per-owner limit any more"


async def test_a_paused_fair_queue_leases_nothing_until_resumed(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", FAIR)
    await service.create_many(store, cfg, "q", [{"user": u} for u in ("alice", "bob") for _ in range(2)])
    assert len(await taken(store, cfg, 1)) == 1
    await service.pause_queue(store, cfg, "q", True)
    assert await taken(store, cfg, 10) == []
    await service.pause_queue(store, cfg, "q", False)
    assert len(await taken(store, cfg, 10)) == 3


async def test_the_next_fair_lease_sweeps_expired_leases_first_and_frees_the_owners_slots(
    store: Store, settings: Settings, clock: ManualClock
) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {**FAIR, "error_delay_ms": 0})
    await service.create_many(store, cfg, "q", [{"user": "alice"} for _ in range(3)])
    [first] = await taken(store, cfg, 1, lease_ms=1_000)
    assert len(await taken(store, cfg, 5)) == 1, "alice's second slot"
    assert await taken(store, cfg, 5) == []
    clock.advance(2_000)
    again = await taken(store, cfg, 5)
    assert len(again) == 1, "the expired lease's slot, taken again (alice's other lease still runs)"
    swept = await service.read(store, first["id"])
    assert swept["error"] == leasing.LEASE_EXPIRED


async def test_a_lease_of_a_paused_fair_queue_still_sweeps_its_expired_leases(store: Store, settings: Settings, clock: ManualClock) -> None:
    """Found by test_fair_lease_differential.py: the function answered a paused queue before looking for expired
    leases, so an item whose last attempt had expired stayed processing where the transaction failed it."""
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {**FAIR, "max_attempts": 1})
    await service.create_many(store, cfg, "q", [{"user": "alice"} for _ in range(3)])
    [first] = await taken(store, cfg, 1, lease_ms=1_000)
    assert len(await taken(store, cfg, 1)) == 1  # the one-call lease, learnt
    await service.pause_queue(store, cfg, "q", True)
    clock.advance(2_000)
    assert await taken(store, cfg, 5) == []
    swept = await service.read(store, first["id"])
    assert swept["status"] == "failed" and swept["error"] == leasing.LEASE_EXPIRED


async def test_a_fair_lease_is_no_earlier_than_a_finish_it_did_not_count(store: Store, settings: Settings, clock: ManualClock, engine: str) -> None:
    """A release that committed before the lease counted what is processing finished no later than the lease began:
    here a finish stamped by a clock running ahead (another server's), then a lease by a clock behind it."""
    if engine != "postgres":
        pytest.skip("the one-call fair lease reads its time in the store; the transaction reads its clock after the count")
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {**FAIR, "per_owner": {"concurrency": 1}})
    await service.create_many(store, cfg, "q", [{"user": "alice"} for _ in range(3)])
    [first] = await taken(store, cfg, 1)
    clock.advance(5_000)
    await leasing.release_many(store, "q", [(int(first["id"]), first["lease"]["token"], outcomes.Complete(None))])
    clock.advance(-5_000)
    [second] = await taken(store, cfg, 1)
    async with store.read() as conn:
        rows = dict((await conn.execute(text("SELECT id, coalesce(finished_at, leased_at) FROM interactions WHERE id IN (:a, :b)"),
                                        {"a": int(first["id"]), "b": int(second["id"])})).all())
    assert rows[int(second["id"])] >= rows[int(first["id"])], "leased before the finish it did not count as processing"


async def test_a_fair_lease_with_rate_limits_is_no_earlier_than_the_lease_before_it(
    store: Store, settings: Settings, clock: ManualClock, engine: str
) -> None:
    """Its caller read the clock before waiting for the queue's row: a lease that held the row meanwhile may have read
    a later one. Each lease's time must be in the rate window it was counted in, so it is never before that one's."""
    if engine != "postgres":
        pytest.skip("the one-call fair lease reads its time in the store; the transaction reads its clock after the lock")
    cfg = settings.interactions
    clock.set(1_000_000)
    await service.put_queue(store, cfg, "q", {**FAIR, "per_owner": {"rate_limit": {"count": 10, "per_ms": 1000}}})
    await service.create_many(store, cfg, "q", [{"user": "alice"} for _ in range(3)])
    [first] = await taken(store, cfg, 1)
    clock.advance(600)
    [second] = await taken(store, cfg, 1)  # the one-call lease
    clock.advance(-200)  # a caller whose clock was read earlier: 1,000,400
    [third] = await taken(store, cfg, 1)
    async with store.read() as conn:
        leased = dict((await conn.execute(text("SELECT id, leased_at FROM interactions WHERE queue = 'q'"))).all())
    assert leased[int(first["id"])] == 1_000_000 and leased[int(second["id"])] == 1_000_600
    assert leased[int(third["id"])] >= 1_000_600, "a lease before the one it waited for"
