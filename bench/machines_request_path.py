"""Start and Call on the request path, in-process (no HTTP): what one server spends per durable step.

    .venv/bin/python -m bench.machines_request_path [--engines sqlite,postgres] [--seconds 5] [--machines 1000]

The processor is the counter of ../shared/bench/http/counter_app.py (plain ``def`` methods, so each step
also pays the hop to a thread that a sync processor costs). For each engine: Start of new machines and Call
on random existing ones, from 1 caller (p50/p99 latency) and from 8 concurrent callers (steps/s), each
answer committed (SQLite: WAL, synchronous=FULL; PostgreSQL: a fresh database on 127.0.0.1).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
import uuid
from typing import Any

import asyncpg

from mainspring.app import App, Registration
from mainspring.config import load_settings
from mainspring.core.runtime import Context
from mainspring.machines import service
from mainspring.store import Store
from mainspring.store.migrate import migrate

PG_ADMIN = os.environ.get("MAINSPRING_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


class Counter:
    """counter_app.py's processor."""

    def init(self, args: Any, machine: Any) -> Any:
        return {"events": [{"n": 0}], "aux_state": {"n": 0}}

    def call(self, args: Any, machine: Any) -> Any:
        n = (machine.get("aux_state") or {}).get("n", 0) + 1
        return {"events": [{"n": n}], "aux_state": {"n": n}, "response": n}


async def database(engine: str, tmp: str) -> tuple[str, Any]:
    if engine == "sqlite":
        return f"sqlite:///{tmp}/bench-{uuid.uuid4().hex[:6]}.db", None
    name = f"bench_request_path_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(PG_ADMIN)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()

    async def drop() -> None:
        c = await asyncpg.connect(PG_ADMIN)
        await c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await c.close()

    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name, drop


CPU: dict[str, float] = {}


async def run_for(seconds: float, callers: int, work: Any) -> list[float]:
    """Run ``work()`` from ``callers`` concurrent loops for ``seconds``; each call's latency in ms. The CPU
    the process and its threads spent per call goes to ``CPU["per_step_ms"]`` (what a loaded machine
    distorts far less than wall time)."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    cpu = time.process_time()

    async def loop() -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await work()
            latencies.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(loop() for _ in range(callers)))
    CPU["per_step_ms"] = (time.process_time() - cpu) * 1000 / max(1, len(latencies))
    return latencies


def summary(name: str, callers: int, seconds: float, latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"{name} c={callers} steps/s={len(latencies) / seconds:,.0f} p50={statistics.median(ordered):.2f}ms "
            f"p99={p99:.2f}ms cpu/step={CPU['per_step_ms']:.2f}ms")


async def bench(engine: str, seconds: float, machines: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url, drop = await database(engine, tmp)
        settings = load_settings(None, server={"database": url, "data_dir": tmp, "sqlite_synchronous": "FULL"})
        store = Store(url, pool_size=20, sqlite_synchronous="FULL")
        await store.start()
        await migrate(store)
        registry = App()
        registry.processors["counters"] = Registration(Counter)
        ctx = Context(settings=settings, store=store, registry=registry)
        try:
            for i in range(machines):
                await service.start_machine(ctx, "counters", f"m{i}", None)
            started = iter(range(10**9))

            async def start() -> None:
                await service.start_machine(ctx, "counters", f"s{next(started)}", None)

            async def call() -> None:
                await service.call_machine(ctx, "counters", f"m{random.randrange(machines)}", "inc")

            for callers in (1, 8):
                for name, work in (("start", start), ("call", call)):
                    print(engine, summary(name, callers, seconds, await run_for(seconds, callers, work)), flush=True)
        finally:
            await store.close()
            if drop is not None:
                await drop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--machines", type=int, default=1000)
    args = parser.parse_args()
    for engine in args.engines.split(","):
        await bench(engine, args.seconds, args.machines)


if __name__ == "__main__":
    asyncio.run(main())
