"""Procrastinate and PgQueuer on the same PostgreSQL, the same way bench/interactions.py measures us.

Run with the peers' own venv (they are not Mainspring dependencies):
    bench/.peers-venv/bin/python -m bench.interactions_peers --pg postgresql://postgres@127.0.0.1:5432/postgres
Prints one JSON line: enqueue rate (one call each, sequential), bulk enqueue rate, processed/s (no-op jobs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from datetime import timedelta
from typing import Any

import asyncpg

from bench.pgcpu import DatabaseCpu


async def fresh(pg_admin: str) -> tuple[str, str]:
    name = f"msbench_peer_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(pg_admin)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    return name, pg_admin.rsplit("/", 1)[0] + "/" + name


async def drop(pg_admin: str, name: str) -> None:
    conn = await asyncpg.connect(pg_admin)
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await conn.close()


# Each peer at its documented defaults, and at the settings that gave it the most processed/s on this machine
# (a sweep: PgQueuer batch_size 10, 100, 500, 1000; Procrastinate concurrency 1, 20, 100).
PGQUEUER = {"defaults": {}, "best": {"batch_size": 1000}}
PROCRASTINATE = {"defaults": {}, "best": {"concurrency": 20}}


async def pgqueuer_bench(dsn: str, jobs: int, settings: dict[str, Any]) -> dict[str, float]:
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    single = min(jobs, 1000)
    began = time.perf_counter()
    for _ in range(single):
        await queries.enqueue("noop", None)
    enqueue = single / (time.perf_counter() - began)
    began = time.perf_counter()
    left = jobs
    while left:
        n = min(1000, left)
        await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
        left -= n
    bulk = jobs / (time.perf_counter() - began)
    qm = QueueManager(queries)

    @qm.entrypoint("noop")
    async def noop(job: Any) -> None:
        return None

    pg_cpu = DatabaseCpu(dsn)
    await pg_cpu.start()
    began, cpu_began = time.perf_counter(), time.process_time()
    await qm.run(mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1), **settings)
    processed = (jobs + single) / (time.perf_counter() - began)
    cpu_us = (time.process_time() - cpu_began) / (jobs + single) * 1e6
    pg_us = (await pg_cpu.stop()) / (jobs + single) * 1e6
    await conn.close()
    return {"enqueue_one_per_call_per_s": enqueue, "bulk_enqueue_per_s": bulk, "processed_per_s": processed,
            "worker_cpu_us_per_item": cpu_us, "postgres_cpu_us_per_item": pg_us}


async def procrastinate_bench(dsn: str, jobs: int, settings: dict[str, Any]) -> dict[str, float]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        single = min(jobs, 1000)
        began = time.perf_counter()
        for _ in range(single):
            await noop.defer_async()
        enqueue = single / (time.perf_counter() - began)
        began = time.perf_counter()
        left = jobs
        while left:
            n = min(1000, left)
            await noop.batch_defer_async(*([{}] * n))
            left -= n
        bulk = jobs / (time.perf_counter() - began)
        began = time.perf_counter()
        await app.run_worker_async(wait=False, install_signal_handlers=False, **settings)
        processed = (jobs + single) / (time.perf_counter() - began)
    return {"enqueue_one_per_call_per_s": enqueue, "bulk_enqueue_per_s": bulk, "processed_per_s": processed}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--settings", default="defaults,best", help="defaults, best, or a JSON object of PgQueuer run() arguments")
    parser.add_argument("--peers", default="pgqueuer,procrastinate")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    benches = {"pgqueuer": (pgqueuer_bench, PGQUEUER), "procrastinate": (procrastinate_bench, PROCRASTINATE)}
    for label in args.peers.split(","):
        bench, known = benches[label]
        for which in args.settings.split(",") if not args.settings.startswith("{") else [args.settings]:
            settings = known[which] if which in known else json.loads(which)
            name, dsn = await fresh(args.pg)
            key = f"{label}/{which}"
            try:
                results[key] = {k: round(v, 1) for k, v in (await bench(dsn, args.jobs, settings)).items()}
            except Exception as exc:
                results[key] = {"failed": repr(exc)[:500]}
            finally:
                await drop(args.pg, name)
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
