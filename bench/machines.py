"""Benchmark of the machines face: steps/s, Start latency, timer firings/s and timer lateness.

    .venv/bin/python -m bench.machines [--engines sqlite,postgres] [--machines 1000] [--calls 5] [--timers 10000]
    .venv/bin/python -m bench.machines --only http     # Calls through an HTTP (JSON) and a Thrift (woody) processor

Rows: ``in_process`` (an async no-op class in this process), ``http`` (the same no-op served by
``mainspring.machines.host`` in a process of its own: bench/machines_processors.py), ``thrift`` (a no-op
Machinegun ``Processor`` over woody, also its own process), ``timers`` (a burst of due timers), ``lateness``.
Each Call row gives calls/s, latency p50/p99 and CPU per call: this process, the processor's process and
PostgreSQL's backends serving the bench's database (so other databases' work on a shared server is not
counted; WAL writing by the server's own processes is not either).

Runs in-process against a real store (SQLite file in a temp dir; a fresh PostgreSQL database created from
$MAINSPRING_BENCH_PG, default postgresql://postgres@127.0.0.1:5432/postgres). Every step is durable: the
processor's events, aux state and timer commit in one transaction before the call returns.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import func, select

from bench import ROOT
from bench.pgcpu import backends_cpu_s
from mainspring.app import App, Registration
from mainspring.config import load_settings
from mainspring.core.runtime import Context, settle_heap
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
    if not values:
        return float("nan")
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


async def backend_pids(ctx: Context) -> set[int]:
    """The PostgreSQL backends serving the bench's database now (none on SQLite)."""
    if not ctx.store.is_postgres:
        return set()
    conn = await asyncpg.connect(PG_ADMIN)
    try:
        rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", ctx.store.url.rsplit("/", 1)[1].split("?")[0])
    finally:
        await conn.close()
    return {row["pid"] for row in rows}


def process_cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) used so far by this process (with its threads), or by process ``pid``."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


async def bench_calls(ctx: Context, namespace: str, machines_count: int, calls: int, concurrency: int, host_pid: int | None = None) -> dict[str, float]:
    started = time.perf_counter()
    start_lat = await run_concurrently(machines_count, 1, lambda i: service.start_machine(ctx, namespace, f"m{i}", None))
    start_elapsed = time.perf_counter() - started
    total = machines_count * calls
    errors.clear()
    pids = await backend_pids(ctx)
    print(f"{namespace}: calls begin", file=sys.stderr, flush=True)  # a profiler attached now sees only the calls
    cpu_before = (process_cpu_s(), process_cpu_s(host_pid) if host_pid else 0.0, backends_cpu_s(pids))
    started = time.perf_counter()
    call_lat = await run_concurrently(total, concurrency, lambda i: service.call_machine(ctx, namespace, f"m{i % machines_count}", i))
    elapsed = time.perf_counter() - started
    cpu_after = (process_cpu_s(), process_cpu_s(host_pid) if host_pid else 0.0, backends_cpu_s(pids | await backend_pids(ctx)))
    server_us, processor_us, pg_us = ((b - a) * 1e6 / total for a, b in zip(cpu_before, cpu_after, strict=True))
    return {
        "start_ms_mean_serial": statistics.mean(start_lat),
        "starts_per_s_serial": machines_count / start_elapsed,
        "calls_per_s": total / elapsed,
        "call_p50_ms": percentile(call_lat, 0.5),
        "call_p99_ms": percentile(call_lat, 0.99),
        "cpu_us_per_call_server": round(server_us),
        "cpu_us_per_call_processor": round(processor_us),
        "cpu_us_per_call_postgres": round(pg_us) if ctx.store.is_postgres else 0,
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
    pids = await backend_pids(ctx)
    cpu_before = process_cpu_s(), backends_cpu_s(pids)
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
    server_us, pg_us = ((b - a) * 1e6 / count for a, b in zip(cpu_before, (process_cpu_s(), backends_cpu_s(pids | await backend_pids(ctx))), strict=True))
    ctx.stopping.set()
    ctx.store.notifier.signal_all()
    await loop
    ctx.stopping.clear()
    return {"timers_due_at_once": count, "timer_firings_per_s": count / elapsed, "cpu_us_per_firing_server": round(server_us),
            "cpu_us_per_firing_postgres": round(pg_us) if ctx.store.is_postgres else 0}


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_processor(kind: str, port: int) -> subprocess.Popen[bytes]:
    """A no-op processor (``json`` or ``thrift``) in a process of its own, once it answers."""
    proc = subprocess.Popen([sys.executable, "-m", "bench.machines_processors", kind, str(port)], cwd=ROOT)
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the {kind} processor did not start")


async def bench_remote(ctx: Context, args: argparse.Namespace, hosts: dict[str, tuple[int, subprocess.Popen[bytes]]], result: dict[str, Any]) -> None:
    """The ``http`` and ``thrift`` rows: Calls through a processor in another process."""
    for kind, (port, host) in hosts.items():
        protocol = "json" if kind == "http" else "machinegun"
        processor = ProcessorConfig(url=f"http://127.0.0.1:{port}/", timeout_ms=10_000, protocol=protocol)
        await put_namespace(ctx, f"remote-{kind}", NamespaceConfig(processor=processor))
        result[kind] = await bench_calls(ctx, f"remote-{kind}", args.machines, args.calls, args.concurrency, host.pid)
        print("postgres" if ctx.store.is_postgres else "sqlite", kind, result[kind], flush=True)


async def bench_engine(engine: str, args: argparse.Namespace, hosts: dict[str, tuple[int, subprocess.Popen[bytes]]]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        url, drop = await fresh_database(engine, tmp)
        processor = NoOp()
        ctx = await context(url, tmp, processor)
        settle_heap()  # as `mainspring serve` does once started: this process is the server here
        try:
            result: dict[str, Any] = {"engine": engine}
            if args.only == "lateness":
                result["lateness"] = await bench_lateness(ctx, processor, args.lateness_timers, args.lateness_rate)
                return result
            if args.only == "calls":
                result["in_process"] = await bench_calls(ctx, "bench", args.machines, args.calls, args.concurrency)
                return result
            if args.only == "http":
                await bench_remote(ctx, args, hosts, result)
                return result
            if args.only == "timers":
                result["timers"] = await bench_timers_burst(ctx, processor, args.timers)
                result["lateness"] = await bench_lateness(ctx, processor, args.lateness_timers, args.lateness_rate)
                return result
            result["in_process"] = await bench_calls(ctx, "bench", args.machines, args.calls, args.concurrency)
            print(engine, "in-process", result["in_process"], flush=True)
            await bench_remote(ctx, args, hosts, result)
            result["timers"] = await bench_timers_burst(ctx, processor, args.timers)
            print(engine, "timers", result["timers"], flush=True)
            result["lateness"] = await bench_lateness(ctx, processor, args.lateness_timers, args.lateness_rate)
        finally:
            client = ctx.extras.pop("machines:http-client", None)
            if client is not None:
                await client.aclose()
            await ctx.store.close()
            if drop is not None:
                await drop()
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=5, help="calls per machine")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--timers", type=int, default=10_000)
    parser.add_argument("--lateness-timers", type=int, default=1000)
    parser.add_argument("--lateness-rate", type=int, default=100)
    parser.add_argument("--only", choices=["all", "lateness", "calls", "http", "timers"], default="all",
                        help="calls: in-process calls only; http: the HTTP and Thrift processor rows only; timers: the burst and the lateness run only")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="the event loop (the server's is uvloop, as uvicorn picks it)")
    parser.add_argument("--port", type=int, default=None, help="the JSON processor's port (the Thrift one's is the next); default: free ports")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(run(args))
    else:
        asyncio.run(run(args))


async def run(args: argparse.Namespace) -> None:
    hosts: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
    try:
        if args.only in ("all", "http"):
            for offset, (row, kind) in enumerate((("http", "json"), ("thrift", "thrift"))):
                port = args.port + offset if args.port else free_port()
                hosts[row] = (port, serve_processor(kind, port))
        for engine in args.engines.split(","):
            result = await bench_engine(engine, args, hosts)
            print(result, flush=True)
    finally:
        for _, host in hosts.values():
            host.kill()


if __name__ == "__main__":
    main()
