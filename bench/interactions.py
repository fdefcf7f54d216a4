"""Benchmark of the interactions face, beside Procrastinate and PgQueuer when they are installed.

    .venv/bin/python -m bench.interactions --pg postgresql://postgres@127.0.0.1:5432/postgres [--jobs 5000]
        [--peers-python bench/.peers-venv/bin/python]

Measures, on PostgreSQL and on SQLite (a fresh database each):
- bulk create: items/s through ``create_many`` (1,000 per transaction);
- end-to-end processing: items/s from "all due" to "all completed" by the worker runtime with a no-op
  async handler (claim and complete in batches);
- producer creates/s: ``mainspring.producer()``, one ``create`` awaited at a time (PgQueuer's and
  Procrastinate's "enqueue one per call" beside it);
- HTTP creates/s: 8 concurrent clients, one POST each call, against a ``mainspring serve`` process;
- idle latency: create → handler start, p50/p95, with the worker idle (PostgreSQL: the creator is
  another connection pool, so the wake-up is a NOTIFY).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
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
import httpx

from bench import ROOT
from bench.pgcpu import DatabaseCpu
from mainspring.app import App
from mainspring.interactions import service
from mainspring.interactions.settings import InteractionsSettings
from mainspring.interactions.worker import Worker
from mainspring.store import Store
from mainspring.store.migrate import migrate

try:
    from mainspring.worker import settle_heap
except ImportError:  # an older version under PYTHONPATH (before/after pairs): it did not settle its heap

    def settle_heap() -> None:
        pass

CFG = InteractionsSettings()

# The worker at its documented defaults (``@app.queue("bench")``), and at the options that gave the most
# processed/s on this machine (a sweep of concurrency/batch 10/100, 100/100, 1000/500, 2000/1000).
WORKER = {"defaults": {}, "best": {"concurrency": 1000, "batch": 500}}


async def fresh_database(kind: str, pg_admin: str, tmp: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp / f'bench-{uuid.uuid4().hex[:6]}.db'}"
    name = f"msbench_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(pg_admin)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    return pg_admin.rsplit("/", 1)[0] + "/" + name


async def drop_database(url: str, pg_admin: str) -> None:
    if url.startswith("postgresql"):
        conn = await asyncpg.connect(pg_admin)
        await conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
        await conn.close()


async def bench_bulk_and_processing(url: str, jobs: int, options: dict[str, Any]) -> dict[str, float]:
    store = Store(url, pool_size=10, sqlite_synchronous="NORMAL" if url.startswith("sqlite") else "FULL")
    await migrate(store)
    await store.start()
    try:
        began = time.perf_counter()
        for start in range(0, jobs, 1000):
            await service.create_many(store, CFG, "bench", [{"data": {"n": i}} for i in range(start, min(jobs, start + 1000))])
        bulk = jobs / (time.perf_counter() - began)

        done = asyncio.Event()
        handled = 0

        app = App()

        @app.queue("bench", **options)
        async def noop(item: Any) -> None:
            nonlocal handled
            handled += 1
            if handled >= jobs:
                done.set()

        worker = Worker(store, app, CFG, poll_ms=1000)
        settle_heap()  # as `mainspring worker` does before its first item (this process stands for it)
        pg_cpu = DatabaseCpu(url) if url.startswith("postgresql") else None
        if pg_cpu is not None:
            await pg_cpu.start()
        began, cpu_began = time.perf_counter(), time.process_time()
        await worker.start()
        await asyncio.wait_for(done.wait(), 600)
        while (await service.get_queue(store, CFG, "bench"))["counts"]["completed"] < jobs:  # noqa: ASYNC110 (polls the store)
            await asyncio.sleep(0.01)
        processed = jobs / (time.perf_counter() - began)
        # This process's CPU per item (the worker's own cost, steadier than a rate on a busy machine).
        cpu_us = (time.process_time() - cpu_began) / jobs * 1e6
        pg_us = (await pg_cpu.stop()) / jobs * 1e6 if pg_cpu is not None else 0.0
        await worker.stop()
        measured = {"bulk_create_per_s": bulk, "processed_per_s": processed, "worker_cpu_us_per_item": cpu_us}
        if url.startswith("postgresql"):
            measured["postgres_cpu_us_per_item"] = pg_us
        return measured
    finally:
        await store.close()


async def bench_producer(url: str, jobs: int, tmp: Path) -> dict[str, float]:
    from mainspring.producer import producer

    async with producer(database=url, data_dir=tmp) as mainspring:
        for i in range(100):  # warm the pool and the statement caches
            await mainspring.create("warm", {"n": i})
        began = time.perf_counter()
        for i in range(jobs):
            await mainspring.create("bench", {"n": i})
        return {"producer_create_one_per_call_per_s": jobs / (time.perf_counter() - began)}


async def bench_idle_latency(url: str, samples: int) -> dict[str, float]:
    worker_store = Store(url, pool_size=5, sqlite_synchronous="NORMAL" if url.startswith("sqlite") else "FULL")
    creator = worker_store if url.startswith("sqlite") else Store(url, pool_size=2)
    await worker_store.start()
    started: dict[str, float] = {}
    got = asyncio.Event()
    app = App()

    @app.queue("latency", concurrency=1)
    async def record(item: Any) -> None:
        started[item.id] = time.perf_counter()
        got.set()

    worker = Worker(worker_store, app, CFG, poll_ms=1000)
    await worker.start()
    latencies = []
    try:
        await asyncio.sleep(0.5)
        for _ in range(samples):
            got.clear()
            t0 = time.perf_counter()
            item, _ = await service.create(creator, CFG, "latency", {})
            await asyncio.wait_for(got.wait(), 10)
            latencies.append((started[item["id"]] - t0) * 1000)
            await asyncio.sleep(0.02)
    finally:
        await worker.stop()
        if creator is not worker_store:
            await creator.close()
        await worker_store.close()
    latencies.sort()
    return {"idle_latency_p50_ms": statistics.median(latencies), "idle_latency_p95_ms": latencies[int(len(latencies) * 0.95) - 1]}


async def commit_floor(pg_admin: str, seconds: float = 3.0) -> dict[str, float]:
    """The machine's floor right now: one-row INSERT transactions/s from 1 client on raw asyncpg."""
    conn = await asyncpg.connect(pg_admin)
    try:
        await conn.execute("DROP TABLE IF EXISTS msbench_floor; CREATE TABLE msbench_floor (id serial primary key, v int)")
        count, began = 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            await conn.execute("INSERT INTO msbench_floor (v) VALUES (1)")
            count += 1
        tps = count / (time.perf_counter() - began)
        await conn.execute("DROP TABLE msbench_floor")
        return {"pg_commit_floor_tps_1_client": tps}
    finally:
        await conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def bench_http_creates(url: str, total: int, clients: int, tmp: Path) -> dict[str, float]:
    port = free_port()
    log = (tmp / f"serve-{port}.log").open("wb")
    env = {**os.environ, "MAINSPRING_SERVER__LOG_LEVEL": "WARNING", "MAINSPRING_SERVER__SQLITE_SYNCHRONOUS": "NORMAL" if url.startswith("sqlite") else "FULL"}
    proc = subprocess.Popen(  # noqa: ASYNC220 (starting the server under test)
        [sys.executable, "-m", "mainspring.cli", "serve", "--port", str(port), "--database", url, "--data-dir", str(tmp / "data")],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as probe:
            for _ in range(300):
                try:
                    if (await probe.get("/readyz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        per_client = total // clients

        async def one_client(n: int) -> None:
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                for i in range(per_client):
                    response = await client.post("/v1/queues/http/interactions", json={"data": {"c": n, "i": i}})
                    response.raise_for_status()

        began = time.perf_counter()
        await asyncio.gather(*(one_client(n) for n in range(clients)))
        return {"http_creates_per_s": per_client * clients / (time.perf_counter() - began)}
    finally:
        proc.terminate()
        proc.wait(30)


class _Arrivals(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.arrived = asyncio.Event()

    def datagram_received(self, data: bytes, _addr: Any) -> None:
        item_id, at = data.decode().split()
        self.started[item_id] = float(at)
        self.arrived.set()


async def _raw_post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, body: bytes) -> bytes:
    """One POST on a kept-alive connection, without an HTTP client's own milliseconds in the measure."""
    writer.write(f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    return await reader.readexactly(length)


async def bench_worker_latency(url: str, samples: int, tmp: Path) -> dict[str, float]:
    """Create → handler start from an HTTP create on ``mainspring serve`` to a standalone ``mainspring worker``
    process (the wake-up crosses processes: NOTIFY on PostgreSQL, the wake-up sockets on SQLite)."""
    loop = asyncio.get_running_loop()
    transport, arrivals = await loop.create_datagram_endpoint(_Arrivals, local_addr=("127.0.0.1", 0))
    udp_port = transport.get_extra_info("sockname")[1]
    port = free_port()
    env = {**os.environ, "MAINSPRING_SERVER__LOG_LEVEL": "WARNING", "MS_LATENCY_PORT": str(udp_port),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    common = ["--database", url, "--data-dir", str(tmp / "data")]
    logs = (tmp / f"latency-{port}.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "mainspring.cli", "serve", "--port", str(port), *common],  # noqa: ASYNC220
                              env=env, stdout=logs, stderr=subprocess.STDOUT)
    worker = None
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as probe:
            for _ in range(300):
                try:
                    if (await probe.get("/readyz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        worker = subprocess.Popen([sys.executable, "-m", "mainspring.cli", "worker", "bench.latency_app:app", *common],  # noqa: ASYNC220
                                  env=env, stdout=logs, stderr=subprocess.STDOUT)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        latencies, answers = [], []
        for i in range(samples + 20):
            arrivals.arrived.clear()
            sent = time.time()
            item = json.loads(await _raw_post(reader, writer, "/v1/queues/latency/interactions", b'{"data": 1}'))
            answered = time.time()
            while item["id"] not in arrivals.started:
                await asyncio.wait_for(arrivals.arrived.wait(), 30)
                arrivals.arrived.clear()
            if i >= 20:  # the first ones wait for the worker to start
                latencies.append((arrivals.started[item["id"]] - sent) * 1000)
                answers.append((answered - sent) * 1000)
            await asyncio.sleep(0.01)
        writer.close()
    finally:
        for proc in (worker, server):
            if proc is not None:
                proc.terminate()
                proc.wait(30)
        transport.close()
    latencies.sort()
    # The create's own answer time beside it: the handler can start before the client has its 201.
    return {"worker_latency_p50_ms": statistics.median(latencies), "worker_latency_p95_ms": latencies[int(len(latencies) * 0.95) - 1],
            "http_create_answer_p50_ms": statistics.median(answers)}


def run_peers(peers_python: str | None, pg_admin: str, jobs: int, settings: str) -> dict[str, Any]:
    if not peers_python or not Path(peers_python).exists():
        return {"skipped": "no peers venv (see bench/README.md)"}
    out = subprocess.run([peers_python, "-m", "bench.interactions_peers", "--pg", pg_admin, "--jobs", str(jobs), "--settings", settings], capture_output=True, text=True, timeout=1200, cwd=ROOT)
    if out.returncode != 0:
        return {"failed": out.stderr[-2000:]}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--http-total", type=int, default=4000)
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument("--engines", default="postgres,sqlite")
    parser.add_argument("--steps", default="processing,producer,latency,worker-latency,http")
    parser.add_argument("--peers-python", default=str(Path(__file__).with_name(".peers-venv") / "bin" / "python"))
    parser.add_argument("--settings", default="defaults,best", help="worker options: defaults, best, or a JSON object")
    args = parser.parse_args()
    settings = [args.settings] if args.settings.startswith("{") else args.settings.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="msbench-"))
    results: dict[str, Any] = {}
    try:
        if "postgres" in args.engines:
            results["machine"] = {k: round(v, 1) for k, v in (await commit_floor(args.pg)).items()}
            print("machine", results["machine"], flush=True)
        for kind in [e for e in args.engines.split(",") if e]:
            row: dict[str, float] = {}
            for step in [s for s in args.steps.split(",") if s]:
                url = await fresh_database(kind, args.pg, tmp)
                try:
                    if step == "processing":
                        for which in settings:
                            options = WORKER[which] if which in WORKER else json.loads(which)
                            measured = await bench_bulk_and_processing(url, args.jobs, options)
                            row.update({f"{k}/{which}": v for k, v in measured.items()})
                            await drop_database(url, args.pg)
                            url = await fresh_database(kind, args.pg, tmp)
                    elif step == "producer":
                        row.update(await bench_producer(url, args.jobs, tmp))
                    elif step == "latency":
                        store = Store(url)
                        await migrate(store)
                        await store.close()
                        row.update(await bench_idle_latency(url, args.latency_samples))
                    elif step == "worker-latency":
                        row.update(await bench_worker_latency(url, args.latency_samples, tmp))
                    else:
                        row.update(await bench_http_creates(url, args.http_total, 8, tmp))
                finally:
                    await drop_database(url, args.pg)
                print(kind, step, json.dumps({k: round(v, 2) for k, v in row.items()}), flush=True)
            results[f"mainspring/{kind}"] = {k: round(v, 2) for k, v in row.items()}
        results["peers"] = run_peers(args.peers_python, args.pg, args.jobs, "defaults,best" if args.settings.startswith("{") else args.settings)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
