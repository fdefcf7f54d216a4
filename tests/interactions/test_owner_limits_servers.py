"""Per-owner limits hold across servers: three ``mainspring serve`` processes on one PostgreSQL, many workers
leasing over HTTP at once, and the store's own record (when each item was leased, when it finished) shows no
owner ever above its concurrency, in any rate window above its count, nor the queue above its own limit.

A lease's time is read once it holds the queue's row and has counted what is processing, and a release's once
it holds the item's: so an item released before a lease counted has finished_at <= that lease's leased_at, and
an overlap of [leased_at, finished_at) intervals is one the limits really allowed."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from mainspring.store import Store

OWNERS = {"alice": 20, "bob": 12, "carol": 8, "dave": 4}
PER_OWNER_CONCURRENCY = 2
RATE_COUNT, RATE_PER_MS = 4, 400
QUEUE_CONCURRENCY = 6


async def _worker(http: httpx.AsyncClient, name: str, stop: asyncio.Event) -> int:
    done = 0
    while not stop.is_set():
        reply = await http.post("/v1/queues/owned/lease", json={"worker": name, "max": 3, "wait_ms": 300})
        assert reply.status_code == 200, reply.text
        for item in reply.json()["interactions"]:
            await asyncio.sleep(random.uniform(0.005, 0.03))
            released = await http.post(f"/v1/interactions/{item['id']}/release",
                                       json={"token": item["lease"]["token"], "outcome": {"complete": {"result": None}}})
            assert released.status_code == 200, released.text
            done += 1
    return done


def most_at_once(intervals: list[tuple[int, int]]) -> int:
    """The most intervals [start, end) open at one moment (an end at t comes before a start at t: a slot freed
    by a release committed at t is what a lease at t may take)."""
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda p: (p[0], p[1]))
    most = running = 0
    for _, step in points:
        running += step
        most = max(most, running)
    return most


async def test_per_owner_concurrency_and_rate_are_never_exceeded_by_three_servers_and_twelve_workers(
    engine: str, database_url: str, servers: Any
) -> None:
    if engine != "postgres":
        pytest.skip("several servers share one PostgreSQL")
    started = servers(3)
    async with httpx.AsyncClient(base_url=started[0].url, timeout=30) as admin:
        reply = await admin.put("/v1/queues/owned", json={
            "owner_by": "user", "fair": True, "weights": {"alice": 2}, "concurrency": QUEUE_CONCURRENCY, "lease_ms": 60_000,
            "per_owner": {"concurrency": PER_OWNER_CONCURRENCY, "rate_limit": {"count": RATE_COUNT, "per_ms": RATE_PER_MS}},
        })
        assert reply.status_code == 200, reply.text
        bulk = [{"user": user, "data": n} for user, count in OWNERS.items() for n in range(count)]
        random.shuffle(bulk)
        assert (await admin.post("/v1/queues/owned/interactions/bulk", json={"interactions": bulk})).status_code == 201
    total = sum(OWNERS.values())
    clients = [httpx.AsyncClient(base_url=s.url, timeout=30) for s in started]
    stop = asyncio.Event()
    try:
        workers = [asyncio.create_task(_worker(clients[n % 3], f"w{n}", stop)) for n in range(12)]
        store = Store(database_url)
        try:
            for _ in range(1800):  # up to 3 minutes on a loaded machine; about 10 s when it is quiet
                async with store.read() as conn:
                    finished = (await conn.execute(text("SELECT count(*) FROM interactions WHERE queue = 'owned' AND state = 'completed'"))).scalar_one()
                if finished == total:
                    break
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.gather(*workers)
            async with store.read() as conn:
                rows = (await conn.execute(text(
                    "SELECT owner, leased_at, finished_at, attempts, state, worker, id FROM interactions WHERE queue = 'owned' ORDER BY leased_at"
                ))).all()
        finally:
            await store.close()
    finally:
        stop.set()
        for http in clients:
            await http.aclose()
    assert [r for r in rows if r.state != "completed" or r.attempts != 1] == [], f"every item leased once and completed: {rows}"
    by_owner: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in rows:
        by_owner[r.owner].append((r.leased_at, r.finished_at))
    assert {o: len(v) for o, v in by_owner.items()} == OWNERS
    for owner, intervals in by_owner.items():
        assert most_at_once(intervals) <= PER_OWNER_CONCURRENCY, (
            f"{owner} ran more than {PER_OWNER_CONCURRENCY} at once: " + "; ".join(f"{r.id} {r.worker} {r.leased_at}-{r.finished_at}" for r in rows if r.owner == owner))
        windows: dict[int, int] = defaultdict(int)
        for leased_at, _ in intervals:
            windows[leased_at - leased_at % RATE_PER_MS] += 1
        assert max(windows.values()) <= RATE_COUNT, f"{owner} leased more than {RATE_COUNT} in one window: {dict(windows)}"
    assert most_at_once([i for v in by_owner.values() for i in v]) <= QUEUE_CONCURRENCY


def test_most_at_once_counts_overlaps_and_lets_a_freed_slot_be_taken_at_the_same_moment() -> None:
    assert most_at_once([(0, 10), (5, 15), (10, 20)]) == 2
    assert most_at_once([(0, 10), (1, 9), (2, 8)]) == 3
    assert most_at_once([]) == 0
