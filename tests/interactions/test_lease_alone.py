"""Leases of an unlimited queue after its first are one statement on PostgreSQL; whatever that statement
cannot decide alone — a limit set since, a pause, expired leases to sweep first — is decided as before."""

from __future__ import annotations

from typing import Any

from mainspring.config import Settings
from mainspring.interactions import leasing, service
from mainspring.store import ManualClock, Store, format_time


async def fill(store: Store, cfg: Any, n: int) -> list[str]:
    return [str((await service.create(store, cfg, "q", {"data": i}))[0]["id"]) for i in range(n)]


async def taken(store: Store, cfg: Any, n: int, **options: Any) -> list[str]:
    return [item["id"] for item in (await leasing.lease(store, cfg, "q", "w", n, **options)).items]


async def test_a_concurrency_limit_set_after_unlimited_leases_holds_at_the_next_lease(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await fill(store, cfg, 6)
    assert len(await taken(store, cfg, 1)) == 1  # learns the queue is unlimited
    assert len(await taken(store, cfg, 1)) == 1  # the one-statement lease
    await service.put_queue(store, cfg, "q", {"concurrency": 3})
    assert len(await taken(store, cfg, 10)) == 1
    assert await taken(store, cfg, 10) == []


async def test_a_paused_queue_leases_nothing_until_resumed(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await fill(store, cfg, 3)
    assert len(await taken(store, cfg, 1)) == 1
    await service.pause_queue(store, cfg, "q", True)
    assert await taken(store, cfg, 10) == []
    await service.pause_queue(store, cfg, "q", False)
    assert len(await taken(store, cfg, 10)) == 2


async def test_the_next_lease_sweeps_expired_leases_first(store: Store, settings: Settings, clock: ManualClock) -> None:
    cfg = settings.interactions
    first, *_ = await fill(store, cfg, 3)
    assert await taken(store, cfg, 1, lease_ms=1_000) == [first]
    assert len(await taken(store, cfg, 1, lease_ms=60_000)) == 1
    clock.advance(2_000)
    await taken(store, cfg, 10)
    swept = await service.read(store, first)
    assert swept["status"] in ("scheduled", "ready") and swept["error"] == leasing.LEASE_EXPIRED


async def test_a_lease_of_a_paused_queue_still_sweeps_its_expired_leases(store: Store, settings: Settings, clock: ManualClock) -> None:
    cfg = settings.interactions
    first, *_ = await fill(store, cfg, 2)
    assert await taken(store, cfg, 1, lease_ms=1_000) == [first]
    assert len(await taken(store, cfg, 1, lease_ms=60_000)) == 1  # the one-statement lease, learnt
    await service.pause_queue(store, cfg, "q", True)
    clock.advance(2_000)
    assert await taken(store, cfg, 10) == []
    swept = await service.read(store, first)
    assert swept["status"] in ("scheduled", "ready") and swept["error"] == leasing.LEASE_EXPIRED


async def test_a_lease_runs_no_longer_than_the_queues_processing_timeout(store: Store, settings: Settings, clock: ManualClock) -> None:
    cfg = settings.interactions
    await fill(store, cfg, 2)
    await service.put_queue(store, cfg, "q", {"processing_timeout_ms": 5_000})
    assert len(await taken(store, cfg, 1)) == 1
    (item,) = (await leasing.lease(store, cfg, "q", "w", 1, lease_ms=60_000)).items
    assert item["lease"]["expires_at"] == format_time(clock.now_ms() + 5_000)
