"""A worker through the HTTP API (``mainspring worker APP --url``) beside a worker on the store (``mainspring
worker APP``): processed/s and CPU per item, on PostgreSQL and SQLite, runs alternated in the same minutes.

    .venv/bin/python -m bench.worker_http [--pg postgresql://postgres@127.0.0.1:5432/postgres] [--jobs 3000]
        [--rounds 2] [--engines postgres,sqlite] [--port 19650]

Each engine gets a fresh database and one ``mainspring serve`` process (the HTTP worker needs it; the
store worker has it beside it too, as in production, so both pay for its background loops). Each round
bulk-creates ``--jobs`` items in a queue of their own, then runs one worker in this process with a no-op
async handler (``concurrency`` 100, ``batch`` 100) until every item is completed, alternating store, HTTP,
store, HTTP. Per run: processed/s, this process's CPU per item (the worker), the server process's CPU per
item, and on PostgreSQL the CPU per item of the bench database's own backends (``pgcpu.DatabaseCpu``: other
databases of the same PostgreSQL, busy on a shared machine, are not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.interactions import drop_database, fresh_database
from bench.pgcpu import DatabaseCpu
from mainspring.app import App
from mainspring.config import load_settings
from mainspring.interactions import service
from mainspring.interactions.settings import InteractionsSettings
from mainspring.store import Store
from mainspring.store.migrate import migrate
from mainspring.worker import Remote, run

CFG = InteractionsSettings()
OPTIONS = {"concurrency": 100, "batch": 100}


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


async def start_server(url: str, port: int, tmp: Path) -> subprocess.Popen[bytes]:
    log = (tmp / f"serve-{port}.log").open("wb")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MAINSPRING_")}, "MAINSPRING_SERVER__LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(  # noqa: ASYNC220 (starting the server under test)
        [sys.executable, "-m", "mainspring.cli", "serve", "--port", str(port), "--database", url, "--data-dir", str(tmp / "data")],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as probe:
        for _ in range(600):
            try:
                if (await probe.get("/readyz")).status_code == 200:
                    return proc
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"the server on {port} never became ready")


async def one_run(store: Store, url: str, server: subprocess.Popen[bytes], port: int, jobs: int, over_http: bool) -> dict[str, float]:
    queue = f"bench-{'http' if over_http else 'store'}-{uuid.uuid4().hex[:6]}"
    for start in range(0, jobs, 1000):
        await service.create_many(store, CFG, queue, [{"data": {"n": i}} for i in range(start, min(jobs, start + 1000))])
    done = asyncio.Event()
    handled = 0
    app = App()

    @app.queue(queue, **OPTIONS)
    async def noop(item: Any) -> None:
        nonlocal handled
        handled += 1
        if handled >= jobs:
            done.set()

    settings = load_settings(None, server={"database": url, "log_level": "WARNING"})
    stop, started = asyncio.Event(), asyncio.Event()
    remote = Remote(f"http://127.0.0.1:{port}") if over_http else None
    pg_cpu = DatabaseCpu(url) if url.startswith("postgresql") else None
    if pg_cpu is not None:
        await pg_cpu.start()
    began, cpu, server_cpu = time.perf_counter(), time.process_time(), process_cpu_s(server.pid)
    worker = asyncio.create_task(run(settings, app, stop=stop, started=started, remote=remote))
    await asyncio.wait_for(done.wait(), 900)
    while (await service.get_queue(store, CFG, queue))["counts"]["completed"] < jobs:  # noqa: ASYNC110 (polls the store)
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - began
    measured = {
        "processed_per_s": jobs / elapsed,
        "worker_cpu_us_per_item": (time.process_time() - cpu) / jobs * 1e6,
        "server_cpu_us_per_item": (process_cpu_s(server.pid) - server_cpu) / jobs * 1e6,
    }
    if pg_cpu is not None:
        measured["postgres_cpu_us_per_item"] = await pg_cpu.stop() / jobs * 1e6
    stop.set()
    await worker
    return measured


async def bench_engine(kind: str, pg_admin: str, jobs: int, rounds: int, port: int, tmp: Path) -> dict[str, list[dict[str, float]]]:
    url = await fresh_database(kind, pg_admin, tmp)
    store = Store(url, pool_size=5)
    await migrate(store)
    await store.start()
    server = await start_server(url, port, tmp)
    runs: dict[str, list[dict[str, float]]] = {"store": [], "http": []}
    try:
        for _ in range(rounds):
            for over_http in (False, True):
                measured = await one_run(store, url, server, port, jobs, over_http)
                runs["http" if over_http else "store"].append(measured)
                print(kind, "http" if over_http else "store", json.dumps({k: round(v, 1) for k, v in measured.items()}), flush=True)
    finally:
        server.terminate()
        server.wait(30)
        await store.close()
        await drop_database(url, pg_admin)
    return runs


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engines", default="postgres,sqlite")
    parser.add_argument("--port", type=int, default=19650)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="msbench-worker-http-"))
    results: dict[str, Any] = {"jobs": args.jobs, "worker": OPTIONS}
    try:
        for kind in [e for e in args.engines.split(",") if e]:
            runs = await bench_engine(kind, args.pg, args.jobs, args.rounds, args.port, tmp)
            results[kind] = {
                way: {k: round(sum(r[k] for r in measured) / len(measured), 1) for k in measured[0]} | {"runs": len(measured)}
                for way, measured in runs.items()
            }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
