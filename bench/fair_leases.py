"""Benchmark of priorities, per-owner limits and fair shares (issue 27's aims), on PostgreSQL.

    .venv/bin/python -m bench.fair_leases --pg postgresql://postgres@127.0.0.1:5432/postgres [--due 1000000]

Each part runs in a fresh database, through the library (``leasing.lease``, ``leasing.release_many``): the
lease's own cost, not HTTP's. Prints JSON with ``uptime``'s load beside every number; CPU is this process's
(utime+stime) and PostgreSQL's (all its processes: run it on a quiet machine, or read it as an upper bound).

- processed/s: 20,000 items over 1,000 owners, a loop of lease(50) + complete, on a queue with ``fair`` and
  ``per_owner`` (concurrency 50) and on the same queue without them, alternating (A B A B);
- a flood: ``--due`` items of one owner due beside 10 small owners; each small owner's item created one at a
  time while a worker loop leases and completes; create → leased p50/p99 on the flooded queue and on an
  empty one;
- lease p50 with ``--due`` items due: all priority 0 vs priorities spread over −5..5 (lease of 10, each
  leased item completed so the backlog stays);
- weighted shares: 4 owners (weights 1, 2, 3, 4) with backlogs, 10,000 leases of 1; each owner's share vs
  its weight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import time
import uuid
from collections import Counter
from typing import Any

import asyncpg
from sqlalchemy import text

from bench.pgcpu import postgres_cpu_s
from mainspring.interactions import leasing, outcomes, service
from mainspring.interactions.settings import InteractionsSettings
from mainspring.store import Store
from mainspring.store.migrate import migrate

CFG = InteractionsSettings()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def fresh(pg_admin: str) -> tuple[Store, str]:
    name = f"msbench_fair_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(pg_admin)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    store = Store(pg_admin.rsplit("/", 1)[0] + "/" + name, pool_size=4)
    await migrate(store)
    return store, name


async def drop(store: Store, name: str, pg_admin: str) -> None:
    await store.close()
    conn = await asyncpg.connect(pg_admin)
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await conn.close()


async def bulk_due(store: Store, queue: str, count: int, owner: str, priorities: int = 0) -> None:
    """``count`` items due now in one statement (generate_series), as create would store them."""
    await service.create_many(store, CFG, queue, [{"user": "seed"}])  # the queue's row, with its settings applied before
    now = store.now_ms() - 1000
    spread = f"(n % {2 * priorities + 1}) - {priorities}" if priorities else "0"
    async with store.transaction() as tx:
        await tx.execute(text(
            "INSERT INTO interactions (queue, \"user\", owner, priority, state, next_processing, attempts, created_at, updated_at, data) "
            f"SELECT :queue, :owner, :owner, {spread}, 'queued', :now, 0, :now, :now, NULL FROM generate_series(1, :count) AS n"
        ), {"queue": queue, "owner": owner, "now": now, "count": count})
    async with store.transaction() as tx:
        await tx.execute(text("ANALYZE interactions"))


async def lease_and_complete(store: Store, queue: str, n: int) -> list[dict[str, Any]]:
    taken = (await leasing.lease(store, CFG, queue, "bench", n)).items
    if taken:
        await leasing.release_many(store, queue, [(int(i["id"]), i["lease"]["token"], outcomes.Complete(None)) for i in taken])
    return taken


async def processed_per_s(pg_admin: str, items: int, owners: int) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {"fair+per_owner": [], "plain": []}
    for _ in range(2):
        for label in ("plain", "fair+per_owner"):
            store, name = await fresh(pg_admin)
            try:
                settings: dict[str, Any] = {"lease_ms": 60_000}
                if label != "plain":
                    settings.update(owner_by="user", fair=True, per_owner={"concurrency": 50})
                await service.put_queue(store, CFG, "q", settings)
                for start in range(0, items, 1000):
                    await service.create_many(store, CFG, "q", [{"user": f"o{n % owners}"} for n in range(start, min(items, start + 1000))])
                # Statistics as autovacuum keeps them for a table that is not new: without them PostgreSQL plans the
                # owned queue's reads of a table it believes empty (it walks every due item to take 50 by id).
                async with store.transaction() as tx:
                    await tx.execute(text("ANALYZE"))
                done, began, cpu0, pg0 = 0, time.perf_counter(), cpu_s(), postgres_cpu_s()
                while done < items:
                    got = await lease_and_complete(store, "q", 50)
                    if not got:
                        break
                    done += len(got)
                wall, cpu, pg = time.perf_counter() - began, cpu_s() - cpu0, postgres_cpu_s() - pg0
                results[label].append({"items_per_s": done / wall, "cpu_ms_per_item": 1000 * cpu / done, "pg_cpu_ms_per_item": 1000 * pg / done,
                                       "load": load()})  # type: ignore[dict-item]
            finally:
                await drop(store, name, pg_admin)
    best = {k: max(r["items_per_s"] for r in v) for k, v in results.items()}
    return {"runs": results, "ratio_fair_to_plain": best["fair+per_owner"] / best["plain"]}


async def flood_latency(pg_admin: str, due: int, samples: int, batch: int = 20) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, flood in (("empty", 0), ("flooded", due)):
        store, name = await fresh(pg_admin)
        try:
            await service.put_queue(store, CFG, "q", {"owner_by": "user", "fair": True, "lease_ms": 60_000})
            if flood:
                await bulk_due(store, "q", flood, "flood")
            stop = asyncio.Event()
            leased_at: dict[str, float] = {}
            # Where a small owner's wait goes: each round's lease and its release (ms), and the items it took.
            rounds: list[tuple[float, float, int]] = []

            async def worker(stop: asyncio.Event, leased_at: dict[str, float], store: Store, rounds: list[tuple[float, float, int]]) -> None:
                while not stop.is_set():
                    began = time.perf_counter()
                    taken = (await leasing.lease(store, CFG, "q", "bench", batch)).items
                    leased = time.perf_counter()
                    for item in taken:
                        leased_at[item["id"]] = leased
                    if taken:
                        await leasing.release_many(store, "q", [(int(i["id"]), i["lease"]["token"], outcomes.Complete(None)) for i in taken])
                    rounds.append((1000 * (leased - began), 1000 * (time.perf_counter() - leased), len(taken)))
                    await asyncio.sleep(0)

            task = asyncio.create_task(worker(stop, leased_at, store, rounds))
            latencies = []
            for n in range(samples):
                created_at = time.perf_counter()
                item, _ = await service.create(store, CFG, "q", {"user": f"small{n % 10}"})
                while item["id"] not in leased_at:  # noqa: ASYNC110 (polled: the worker loop records it)
                    await asyncio.sleep(0.001)
                latencies.append(1000 * (leased_at[item["id"]] - created_at))
            stop.set()
            await task
            latencies.sort()
            out[label] = {"p50_ms": statistics.median(latencies), "p99_ms": latencies[int(0.99 * (len(latencies) - 1))], "load": load(),
                          "lease_p50_ms": statistics.median(r[0] for r in rounds), "release_p50_ms": statistics.median(r[1] for r in rounds),
                          "items_per_round": statistics.mean(r[2] for r in rounds)}
        finally:
            await drop(store, name, pg_admin)
    out["p99_ratio"] = out["flooded"]["p99_ms"] / out["empty"]["p99_ms"]
    return out


async def lease_p50(pg_admin: str, due: int, leases: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, spread in (("without priorities", 0), ("with priorities", 5)):
        store, name = await fresh(pg_admin)
        try:
            await service.put_queue(store, CFG, "q", {"lease_ms": 60_000})
            await bulk_due(store, "q", due, "", priorities=spread)
            times = []
            cpu0 = cpu_s()
            for _ in range(leases):
                began = time.perf_counter()
                taken = (await leasing.lease(store, CFG, "q", "bench", 10)).items
                times.append(1000 * (time.perf_counter() - began))
                await leasing.release_many(store, "q", [(int(i["id"]), i["lease"]["token"], outcomes.Complete(None)) for i in taken])
            out[label] = {"p50_ms": statistics.median(times), "cpu_ms_per_lease": 1000 * (cpu_s() - cpu0) / leases, "load": load()}
        finally:
            await drop(store, name, pg_admin)
    out["p50_ratio"] = out["with priorities"]["p50_ms"] / out["without priorities"]["p50_ms"]
    return out


async def weighted_shares(pg_admin: str, leases: int) -> dict[str, Any]:
    store, name = await fresh(pg_admin)
    weights = {"w1": 1, "w2": 2, "w3": 3, "w4": 4}
    try:
        await service.put_queue(store, CFG, "q", {"owner_by": "user", "fair": True, "weights": weights, "lease_ms": 600_000})
        for owner, weight in weights.items():
            await bulk_due(store, "q", leases * weight // 10 + 100, owner)
        taken: Counter[str] = Counter()
        for _ in range(leases):
            for item in (await leasing.lease(store, CFG, "q", "bench", 1)).items:
                taken[item["user"]] += 1
        total = sum(weights.values())
        shares = {o: {"share": taken[o] / leases, "weight_share": w / total, "off_by": abs(taken[o] / leases - w / total) / (w / total)}
                  for o, w in weights.items()}
        return {"leases": leases, "shares": shares, "worst_off_by": max(s["off_by"] for s in shares.values()), "load": load()}
    finally:
        await drop(store, name, pg_admin)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--due", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--parts", default="processed,flood,lease,shares")
    parser.add_argument("--leases", type=int, default=10_000, help="leases of 1 for the weighted shares")
    parser.add_argument("--flood-lease", type=int, default=20, help="what the flood part's worker leases a round")
    args = parser.parse_args()
    parts = args.parts.split(",")
    report: dict[str, Any] = {"load_at_start": load()}
    if "shares" in parts:
        report["weighted_shares"] = await weighted_shares(args.pg, args.leases)
        print(json.dumps(report, indent=1), flush=True)
    if "lease" in parts:
        report["lease_p50"] = await lease_p50(args.pg, args.due, 300)
        print(json.dumps(report, indent=1), flush=True)
    if "flood" in parts:
        report["flood"] = await flood_latency(args.pg, args.due, 200, args.flood_lease)
        print(json.dumps(report, indent=1), flush=True)
    if "processed" in parts:
        report["processed"] = await processed_per_s(args.pg, args.items, 1000)
    report["load_at_end"] = load()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
