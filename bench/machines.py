"""Benchmark of the machines face: steps/s, Start latency, timer firings/s and timer lateness.

    .venv/bin/python bench/machines.py [--engines sqlite,postgres] [--machines 1000] [--calls 5] [--timers 10000]

Runs in-process against a real store (SQLite file in a temp dir; a fresh PostgreSQL database created from
$MAINSPRING_BENCH_PG, default postgresql://postgres@127.0.0.1:5432/postgres). Every step is durable: the
processor's events, aux state and timer commit in one transaction before the call returns.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import asyncpg
import httpx
from sqlalchemy import func, select

from mainspring.app import App, Registration
from mainspring.config import load_settings
from mainspring.core.runtime import Context
from mainspring.machines import service
from mainspring.machines.background import machines_loop
from mainspring.machines.namespaces import put_namespace
from mainspring.machines.settings import NamespaceConfig, ProcessorConfig
from mainspring.machines.tables import machines
from mainspring.store import Store
from mainspring.store.migrate import migrate

PG_ADMIN = os.environ.get("MAINSPRING_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


class NoOp:
    """An in-process processor that appends one event per step and changes nothing else."""

    fired: list[int]
    lateness: list[float]

    def __init__(self) -> None:
        self.fired = []
        self.lateness = []

    async def init(self, args: Any, machine: Any) -> Any:
        if args and "due" in args:
            return {"events": ["started"], "action": {"timer": {"at": args["due"]}}}
        return {"events": ["started"]}

    async def call(self, args: Any, machine: Any) -> Any:
        return {"events": [args], "response": args}

    async def timeout(self, args: Any, machine: Any) -> Any:
        now = time.time_ns() // 1_000_000
        self.fired.append(now)
        if isinstance(machine["aux_state"], dict) and "due" in machine["aux_state"]:
            self.lateness.append(now - machine["aux_state"]["due"])
        return {"events": ["fired"]}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


async def fresh_database(engine: str, tmp: str) -> tuple[str, Any]:
    if engine == "sqlite":
        return f"sqlite:///{tmp}/bench-{uuid.uuid4().hex[:6]}.db", None
    name = f"bench_machines_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(PG_ADMIN)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()

    async def drop() -> None:
        c = await asyncpg.connect(PG_ADMIN)
        await c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await c.close()

    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name, drop


async def context(url: str, tmp: str, processor: NoOp) -> Context:
    settings = load_settings(None, server={"database": url, "data_dir": tmp, "pool_size": 20, "sqlite_synchronous": "FULL"}, machines={"concurrency": 64, "batch": 500})
    store = Store(url, pool_size=20, sqlite_synchronous="FULL")
    await store.start()
    await migrate(store)
    registry = App()
    registry.processors["bench"] = Registration(processor)
    return Context(settings=settings, store=store, registry=registry)


errors: list[str] = []


async def run_concurrently(count: int, concurrency: int, work: Any) -> list[float]:
    """Run ``work(i)`` for i in range(count) with ``concurrency`` workers; answer each one's latency (ms)."""
    latencies: list[float] = []
    next_index = iter(range(count))

    async def worker() -> None:
        for i in next_index:
            started = time.perf_counter()
            try:
                await work(i)
            except Exception as exc:  # counted, not fatal: an overloaded processor host may drop a connection
                errors.append(type(exc).__name__)
                continue
            latencies.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def bench_calls(ctx: Context, namespace: str, machines_count: int, calls: int, concurrency: int) -> dict[str, float]:
    started = time.perf_counter()
    start_lat = await run_concurrently(machines_count, 1, lambda i: service.start_machine(ctx, namespace, f"m{i}", None))
    start_elapsed = time.perf_counter() - started
    total = machines_count * calls
    errors.clear()
    started = time.perf_counter()
    call_lat = await run_concurrently(total, concurrency, lambda i: service.call_machine(ctx, namespace, f"m{i % machines_count}", i))
    elapsed = time.perf_counter() - started
    return {
        "start_ms_mean_serial": statistics.mean(start_lat),
        "starts_per_s_serial": machines_count / start_elapsed,
        "calls_per_s": total / elapsed,
        "call_p50_ms": percentile(call_lat, 0.5),
        "call_p99_ms": percentile(call_lat, 0.99),
        "errors": len(errors),
    }


async def bench_timers_burst(ctx: Context, processor: NoOp, count: int) -> dict[str, float]:
    """``count`` machines whose timers are all due now; time until every one has fired into history."""
    now = ctx.now_ms()
    rows = [
        {"namespace": "burst", "id": f"t{i}", "status": "working", "version": 1, "last_event_id": 0, "aux_state": None,
         "timer_at": now, "wake_at": now, "retry_attempt": 0, "created_at": now, "updated_at": now}
        for i in range(count)
    ]
    async with ctx.store.transaction() as tx:
        for chunk in range(0, count, 1000):
            await tx.execute(machines.insert(), rows[chunk : chunk + 1000])
    ctx.registry.processors["burst"] = Registration(processor)
    processor.fired.clear()
    started = time.perf_counter()
    loop = asyncio.create_task(machines_loop(ctx))
    while len(processor.fired) < count:  # noqa: ASYNC110 - polling a counter the processor fills
        await asyncio.sleep(0.05)
    while True:
        async with ctx.store.read() as conn:
            left = (await conn.execute(select(func.count()).select_from(machines).where(machines.c.namespace == "burst", machines.c.timer_at.is_not(None)))).scalar_one()
        if not left:
            break
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - started
    ctx.stopping.set()
    ctx.store.notifier.signal_all()
    await loop
    ctx.stopping.clear()
    return {"timers_due_at_once": count, "timer_firings_per_s": count / elapsed}


async def bench_lateness(ctx: Context, processor: NoOp, count: int, rate: int) -> dict[str, float]:
    """Timers spread at ``rate`` per second, written straight into the store so that slow set-up cannot make
    them late before the loop even starts; lateness = processor call time - due time."""
    processor.lateness.clear()
    base = ctx.now_ms() + 2000
    rows = []
    for i in range(count):
        due = base + int(i * 1000 / rate)
        rows.append({"namespace": "bench", "id": f"late{i}", "status": "working", "version": 1, "last_event_id": 0,
                     "aux_state": {"due": due}, "timer_at": due, "wake_at": due, "retry_attempt": 0, "created_at": base, "updated_at": base})
    async with ctx.store.transaction() as tx:
        await tx.execute(machines.insert(), rows)
    loop = asyncio.create_task(machines_loop(ctx))
    while len(processor.lateness) < count:  # noqa: ASYNC110 - polling a counter the processor fills
        await asyncio.sleep(0.05)
    ctx.stopping.set()
    ctx.store.notifier.signal_all()
    await loop
    ctx.stopping.clear()
    lateness = processor.lateness
    return {"timers_spread": count, "timer_rate_per_s": rate, "lateness_p50_ms": percentile(lateness, 0.5), "lateness_p99_ms": percentile(lateness, 0.99), "lateness_max_ms": max(lateness)}


def serve_http_processor(port: int) -> subprocess.Popen[bytes]:
    code = (
        "from mainspring.machines.host import serve_processor\n"
        "class NoOp:\n"
        "    async def init(self, a, m): return {'events': ['started']}\n"
        "    async def call(self, a, m): return {'events': [a], 'response': a}\n"
        f"serve_processor(NoOp, port={port})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    for _ in range(100):
        try:
            httpx.post(f"http://127.0.0.1:{port}/", json={"kind": "call", "args": 1, "machine": {}}, timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("processor host did not start")


async def bench_engine(engine: str, args: argparse.Namespace, http_port: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        url, drop = await fresh_database(engine, tmp)
        processor = NoOp()
        ctx = await context(url, tmp, processor)
        try:
            result: dict[str, Any] = {"engine": engine}
            if args.only == "lateness":
                result["lateness"] = await bench_lateness(ctx, processor, args.lateness_timers, args.lateness_rate)
                return result
            if args.only == "calls":
                result["in_process"] = await bench_calls(ctx, "bench", args.machines, args.calls, args.concurrency)
                return result
            if args.only == "timers":
                result["timers"] = await bench_timers_burst(ctx, processor, args.timers)
                result["lateness"] = await bench_lateness(ctx, processor, args.lateness_timers, args.lateness_rate)
                return result
            result["in_process"] = await bench_calls(ctx, "bench", args.machines, args.calls, args.concurrency)
            print(engine, "in-process", result["in_process"], flush=True)
            await put_namespace(ctx, "remote", NamespaceConfig(processor=ProcessorConfig(url=f"http://127.0.0.1:{http_port}/", timeout_ms=10_000)))
            result["http"] = await bench_calls(ctx, "remote", args.machines, args.calls, args.concurrency)
            print(engine, "http", result["http"], flush=True)
            result["timers"] = await bench_timers_burst(ctx, processor, args.timers)
            print(engine, "timers", result["timers"], flush=True)
            result["lateness"] = await bench_lateness(ctx, processor, args.lateness_timers, args.lateness_rate)
            client = ctx.extras.pop("machines:http-client", None)
            if client is not None:
                await client.aclose()
        finally:
            await ctx.store.close()
            if drop is not None:
                await drop()
        return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=5, help="calls per machine")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--timers", type=int, default=10_000)
    parser.add_argument("--lateness-timers", type=int, default=1000)
    parser.add_argument("--lateness-rate", type=int, default=100)
    parser.add_argument("--only", choices=["all", "lateness", "calls", "timers"], default="all",
                        help="calls: in-process calls only; timers: the burst and the lateness run only")
    args = parser.parse_args()
    port = 18000 + os.getpid() % 1000
    host = serve_http_processor(port) if args.only == "all" else None
    try:
        for engine in args.engines.split(","):
            result = await bench_engine(engine, args, port)
            print(result, flush=True)
    finally:
        if host is not None:
            host.kill()


if __name__ == "__main__":
    asyncio.run(main())
