"""One item is never handed to two workers at once, however many stores and servers lease it together.

Several stores on one database (each with its own pool, as separate servers have) lease the same queue at the same
moment, round after round, for each kind of queue — plain (the one-statement lease), limited by concurrency or by
rate, owned with per-owner limits, fair (on PostgreSQL the one-call function) — with batch leases among them. After
each round most of what was taken is completed and the rest left to expire, so the next round also sweeps expired
leases and takes them over.

On PostgreSQL every round starts from the same instant on purpose: a transaction holds the queue's row (as an
expiry sweep or a settings change does) while the leases are sent, and lets go only once every one of them waits
for it. Their statements then start from one snapshot — the moment a guard like ``FOR UPDATE SKIP LOCKED`` is for
— so a missing guard hands items twice in the first round, not by luck of timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import select, text

from mainspring.config import Settings
from mainspring.core.tables import events
from mainspring.interactions import leasing, outcomes, service
from mainspring.store import ManualClock, Store

LEASE_MS = 1_000
ITEMS = 48
OWNERS = ("alice", "bob", "carol")
COMMON = {"lease_ms": LEASE_MS, "error_delay_ms": 0, "max_attempts": 1_000}
KINDS: dict[str, dict[str, Any]] = {
    "plain": {},
    "concurrency": {"concurrency": 4},
    "rate": {"rate_limit": {"count": 6, "per_ms": LEASE_MS}},
    "owned": {"owner_by": "user", "per_owner": {"concurrency": 2}},
    "fair": {"owner_by": "user", "fair": True, "weights": {"alice": 2}, "per_owner": {"concurrency": 3}},
}
STORES = 3
LEASERS_PER_STORE = 2
BATCH = (1, 4)
"""The ``max`` of each store's leasers: one item at a time, and batches."""

# Backends of the test's database waiting for a lock: the leases of a round (nothing else runs here but a
# server's background loops).
_WAITING = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"


def raw_url(database_url: str) -> str:
    return database_url.replace("postgresql+asyncpg://", "postgresql://")


@contextlib.asynccontextmanager
async def queue_held(database_url: str, queue: str) -> AsyncIterator[Callable[[list[asyncio.Task[Any]]], Awaitable[None]]]:
    """Hold ``queue``'s row and its owners' rows (PostgreSQL) while the block sends its leases, as an expiry sweep
    holds the one and creates the others; the block then awaits the function this yields with the leases' tasks,
    which returns once each of them waits for a lock (or has ended without: a lease that no longer takes them), and
    lets go. A lease waits for the queue's row before it reads anything; one that did not would still wait for the
    owners' rows before it writes what it read."""
    holder = await asyncpg.connect(raw_url(database_url))
    watcher = await asyncpg.connect(raw_url(database_url))
    released = False

    async def let_go_once_waiting(leases: list[asyncio.Task[Any]]) -> None:
        nonlocal released
        deadline = time.monotonic() + 60
        while (waiting := await watcher.fetchval(_WAITING)) + sum(t.done() for t in leases) < len(leases):
            assert time.monotonic() < deadline, f"only {waiting} of {len(leases)} leases waited for the queue's row"
            await asyncio.sleep(0.005)
        await holder.execute("COMMIT")
        released = True

    try:
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM interaction_queues WHERE name = $1 FOR UPDATE", queue)
        await holder.execute("SELECT 1 FROM interaction_owners WHERE queue = $1 ORDER BY owner FOR UPDATE", queue)
        yield let_go_once_waiting
    finally:
        if not released:
            await holder.execute("ROLLBACK")
        await holder.close()
        await watcher.close()


async def lease_together(
    engine: str, database_url: str, queue: str, leases: Sequence[Callable[[], Awaitable[list[dict[str, Any]]]]]
) -> list[dict[str, Any]]:
    """Run every lease of ``leases`` at once (on PostgreSQL from behind the queue's row); answers all they took."""
    if engine != "postgres":
        taken = await asyncio.gather(*(lease() for lease in leases))
        return [item for items in taken for item in items]
    async with queue_held(database_url, queue) as let_go_once_waiting:
        tasks = [asyncio.create_task(lease()) for lease in leases]
        try:
            await let_go_once_waiting(tasks)
            taken = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        finally:
            for task in tasks:
                task.cancel()
    return [item for items in taken for item in items]


def check_round(kind: str, settings: dict[str, Any], taken: list[dict[str, Any]], takeable: int | None) -> None:
    """What one round of leases, all at one moment, may take: each item once, within the queue's limits (nothing is
    held across rounds: what was not completed has expired); and when leases that wait for each other see what
    those before them took (``takeable`` not None), as many as they would one after another."""
    twice = {i: n for i, n in Counter(item["id"] for item in taken).items() if n > 1}
    assert not twice, f"{kind}: items handed more than once in one round: {twice}"
    if "concurrency" in settings:
        assert len(taken) <= settings["concurrency"], f"{kind}: {len(taken)} leased at once"
    if "rate_limit" in settings:
        assert len(taken) <= settings["rate_limit"]["count"], f"{kind}: {len(taken)} leased in one rate window"
    if per_owner := settings.get("per_owner", {}).get("concurrency"):
        by_owner = Counter(item["user"] for item in taken)
        assert max(by_owner.values(), default=0) <= per_owner, f"{kind}: an owner above its limit: {by_owner}"
    if takeable is not None:
        assert len(taken) == takeable, f"{kind}: the leases took {len(taken)} where one after another would take {takeable}"


async def takeable_now(store: Store, queue: str, settings: dict[str, Any], room: int) -> int:
    """How many items leases of ``room`` in all, one after another, would take now: those due, and those whose
    lease has expired (retried at once), within the queue's limits."""
    now = store.now_ms()
    async with store.read() as conn:
        rows = (await conn.execute(text(
            "SELECT owner, count(*) FROM interactions WHERE queue = :queue AND ((state = 'queued' AND next_processing <= :now) "
            "OR (state = 'processing' AND lease_expires_at <= :now)) GROUP BY owner"), {"queue": queue, "now": now})).all()
    due = {str(owner): int(n) for owner, n in rows}
    if per_owner := settings.get("per_owner", {}).get("concurrency"):
        due = {owner: min(n, per_owner) for owner, n in due.items()}
    most = min(room, sum(due.values()), settings.get("concurrency", room))
    return min(most, settings["rate_limit"]["count"]) if "rate_limit" in settings else most


async def handed_out(store: Store) -> Counter[str]:
    """How many times each item was leased, by its ``interaction.changed`` events to processing."""
    async with store.read() as conn:
        rows = (await conn.execute(select(events.c.subject_id, events.c.data).where(events.c.type == "interaction.changed"))).all()
    return Counter(subject for subject, data in rows if data["status"] == "processing")


@pytest.mark.parametrize("kind", list(KINDS))
async def test_stores_leasing_at_once_never_hand_one_item_twice(
    kind: str, engine: str, database_url: str, store: Store, settings: Settings, clock: ManualClock
) -> None:
    cfg = settings.interactions
    queue_settings = {**COMMON, **KINDS[kind]}
    await service.put_queue(store, cfg, "q", queue_settings)
    await service.create_many(store, cfg, "q", [{"user": OWNERS[n % len(OWNERS)], "data": n} for n in range(ITEMS)])
    stores = [store] + [Store(database_url, clock=clock, pool_size=LEASERS_PER_STORE + 1, sqlite_synchronous="NORMAL") for _ in range(STORES - 1)]
    try:
        for other in stores[1:]:
            await other.start()
        leases = [
            (lambda s=s, n=n, k=k: _lease(s, cfg, f"w{k}-{n}", BATCH[n % len(BATCH)]))
            for k, s in enumerate(stores) for n in range(LEASERS_PER_STORE)
        ]
        completed: set[str] = set()
        times: Counter[str] = Counter()
        room = STORES * sum(BATCH[n % len(BATCH)] for n in range(LEASERS_PER_STORE))
        for round_ in range(100):
            # Leases see what those before them took (a lock, or SKIP LOCKED from one snapshot), except a plain queue's
            # on PostgreSQL that have expired leases to sweep: they hold its row side by side (shared), and one may find
            # none expired while another sweeps them, and take less.
            sweeping_side_by_side = engine == "postgres" and kind == "plain" and round_ % 2 == 0 and round_ > 0
            takeable = None if sweeping_side_by_side else await takeable_now(store, "q", KINDS[kind], room)
            taken = await lease_together(engine, database_url, "q", leases)
            check_round(kind, KINDS[kind], taken, takeable)
            times.update(item["id"] for item in taken)
            # Completed (each lease still held: a second holder would have lost it), all of them or, every other
            # round, two of every three: the rest expire, and the next round's leases sweep them first and take them
            # over (on PostgreSQL a plain queue's leases then take the transaction's path, else the one statement).
            done = [item for n, item in enumerate(sorted(taken, key=lambda i: int(i["id"]))) if round_ % 2 == 0 or n % 3 != 2]
            releases = [(int(item["id"]), item["lease"]["token"], outcomes.Complete(None)) for item in done]
            assert await leasing.release_many(stores[-1], "q", releases) == [True] * len(done)
            completed.update(item["id"] for item in done)
            if len(completed) == ITEMS:
                break
            clock.advance(LEASE_MS + 1)
        assert len(completed) == ITEMS, f"{kind}: {ITEMS - len(completed)} items never completed"
    finally:
        for other in stores[1:]:
            await other.close()
    assert await handed_out(store) == times, "the store leased items the leases did not answer"


async def _lease(store: Store, cfg: Any, worker: str, most: int) -> list[dict[str, Any]]:
    return (await leasing.lease(store, cfg, "q", worker, most)).items


SERVERS = 2
SERVER_KINDS = ("plain", "concurrency", "owned", "fair")
SERVER_ITEMS = 24


async def test_servers_leasing_at_once_never_hand_one_item_twice(engine: str, database_url: str, servers: Any) -> None:
    """The same through ``mainspring serve`` processes, every queue kind in one database: each server's workers lease
    over HTTP at the same moment, round after round, and complete what they took."""
    if engine != "postgres":
        pytest.skip("several servers share one PostgreSQL")
    started = servers(SERVERS)
    clients = [httpx.AsyncClient(base_url=s.url, timeout=60) for s in started]
    store = Store(database_url)
    room = SERVERS * sum(BATCH[n % len(BATCH)] for n in range(LEASERS_PER_STORE))
    try:
        admin = clients[0]
        for kind in SERVER_KINDS:
            reply = await admin.put(f"/v1/queues/{kind}", json={**COMMON, "lease_ms": 60_000, **KINDS[kind]})
            assert reply.status_code == 200, reply.text
            bulk = [{"user": OWNERS[n % len(OWNERS)], "data": n} for n in range(SERVER_ITEMS)]
            assert (await admin.post(f"/v1/queues/{kind}/interactions/bulk", json={"interactions": bulk})).status_code == 201
        for kind in SERVER_KINDS:
            leases = [
                (lambda c=c, n=n, k=k, kind=kind: _lease_over_http(c, kind, f"s{k}-{n}", BATCH[n % len(BATCH)]))
                for k, c in enumerate(clients) for n in range(LEASERS_PER_STORE)
            ]
            times: Counter[str] = Counter()
            for _ in range(100):
                takeable = await takeable_now(store, kind, KINDS[kind], room)
                taken = await lease_together(engine, database_url, kind, leases)
                check_round(kind, KINDS[kind], taken, takeable)
                times.update(item["id"] for item in taken)
                for n, item in enumerate(taken):
                    reply = await clients[n % SERVERS].post(
                        f"/v1/interactions/{item['id']}/release", json={"token": item["lease"]["token"], "outcome": {"complete": {"result": None}}}
                    )
                    assert reply.status_code == 200, f"{kind}: {reply.text}"
                if sum(times.values()) == SERVER_ITEMS:
                    break
            assert sorted(times.values()) == [1] * SERVER_ITEMS, f"{kind}: every item leased once: {times}"
    finally:
        await store.close()
        for http in clients:
            await http.aclose()


async def _lease_over_http(http: httpx.AsyncClient, queue: str, worker: str, most: int) -> list[dict[str, Any]]:
    reply = await http.post(f"/v1/queues/{queue}/lease", json={"worker": worker, "max": most})
    assert reply.status_code == 200, reply.text
    return list(reply.json()["interactions"])
