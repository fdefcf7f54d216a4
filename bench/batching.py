"""Benchmark of the batching face against a real `mainspring serve` process, on SQLite and PostgreSQL.

Measures, per engine:
- tasks/s submitted (HTTP 202s, C concurrent submitters, pairs of books) and tasks/s packed (until none pending);
- packages/s claimed and completed (C concurrent workers, claim → complete);
- flush lateness vs linger_ms: when the dispatcher packed a pair, minus (the second task's arrival + linger_ms),
  read from the server's own timestamps (created_at / updated_at of the tasks).

    .venv/bin/python bench/batching.py --engine both --tasks 2000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
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

from mainspring.store import parse_time

PG_ADMIN = os.environ.get("MAINSPRING_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, database: str, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mainspring.cli", "serve", "--port", str(self.port), "--database", database,
             "--data-dir", str(data_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "MAINSPRING_SERVER__LOG_LEVEL": "WARNING", "MAINSPRING_SERVER__SQLITE_SYNCHRONOUS": "NORMAL"},
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def baseline(url: str, requests: int, concurrency: int) -> float:
    """GET /healthz per second with the same concurrency: how fast this machine serves anything right now."""
    async def lane() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            for _ in range(requests // concurrency):
                await http.get("/healthz")

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return (requests // concurrency) * concurrency / (time.perf_counter() - started)


async def submit_all(url: str, name: str, pairs: int, concurrency: int) -> float:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for g in range(pairs):
        queue.put_nowait(g)

    async def lane() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while not queue.empty():
                g = queue.get_nowait()
                for member in ("en", "ru"):
                    r = await http.post(f"/v1/batchers/{name}/tasks",
                                        json={"id": f"{g}-{member}", "group": str(g), "member": member,
                                              "content": f"book {g} in {member} " * 20})
                    assert r.status_code == 202, r.text

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return time.perf_counter() - started


async def wait_packed(url: str, name: str, total: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        while True:
            counts = (await http.get(f"/v1/batchers/{name}")).json()["counts"]
            if counts["pending"] == 0 and counts["packed"] + counts["rejected"] >= total:
                return
            await asyncio.sleep(0.02)


async def work_all(url: str, name: str, packages: int, concurrency: int) -> tuple[float, float]:
    claim_time = 0.0
    done = 0
    started = time.perf_counter()

    async def worker(i: int) -> None:
        nonlocal claim_time, done
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while True:
                t0 = time.perf_counter()
                r = await http.post(f"/v1/batchers/{name}/packages/claim", json={"worker": f"w{i}", "wait_ms": 0})
                claim_time += time.perf_counter() - t0
                if r.status_code == 204:
                    return
                package = r.json()
                c = await http.post(f"/v1/packages/{package['id']}/complete",
                                    json={"token": package["lease"]["token"],
                                          "results": {t["id"]: {"ok": True} for t in package["tasks"]}})
                assert c.status_code == 200, c.text
                done += 1

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    assert done == packages, (done, packages)
    return elapsed, claim_time / concurrency


async def lateness(url: str, linger_ms: int, rounds: int) -> list[int]:
    name = f"late-{linger_ms}-{uuid.uuid4().hex[:6]}"
    out = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        (await http.put(f"/v1/batchers/{name}", json={"min_size": 2, "max_size": 6, "linger_ms": linger_ms,
                                                       "group_size": 2})).raise_for_status()
        for r in range(rounds):
            for member in ("en", "ru"):
                await http.post(f"/v1/batchers/{name}/tasks",
                                json={"id": f"{r}-{member}", "group": str(r), "member": member, "content": f"{r}{member}"})
            while True:
                task = (await http.get(f"/v1/batchers/{name}/tasks/{r}-ru")).json()
                if task["status"] != "pending":
                    break
                await asyncio.sleep(0.005)
            out.append(parse_time(task["updated_at"]) - parse_time(task["created_at"]) - linger_ms)
    return out


async def bench_engine(engine: str, tasks: int, concurrency: int, lingers: list[int], rounds: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-batching-"))
    pg_name = f"bench_batching_{uuid.uuid4().hex[:8]}"
    if engine == "sqlite":
        database = f"sqlite:///{tmp / 'mainspring.db'}"
    else:
        conn = await asyncpg.connect(PG_ADMIN)
        await conn.execute(f'CREATE DATABASE "{pg_name}"')
        await conn.close()
        database = PG_ADMIN.rsplit("/", 1)[0] + "/" + pg_name
    server = Server(database, tmp / "data")
    try:
        name = "bench"
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            (await http.put(f"/v1/batchers/{name}", json={"min_size": 2, "max_size": 6, "linger_ms": 50,
                                                          "max_wait_ms": 600_000, "group_size": 2,
                                                          "incomplete_group": "carry"})).raise_for_status()
        healthz = await baseline(server.url, 1000, concurrency)
        started = time.perf_counter()
        submit_s = await submit_all(server.url, name, tasks // 2, concurrency)
        await wait_packed(server.url, name, tasks)
        packed_s = time.perf_counter() - started
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            packages = (await http.get(f"/v1/batchers/{name}")).json()["package_counts"]["ready"]
        work_s, _ = await work_all(server.url, name, packages, concurrency)
        late = {linger: await lateness(server.url, linger, rounds) for linger in lingers}
        return {
            "engine": engine,
            "tasks": tasks,
            "healthz_per_s": healthz,
            "load": os.getloadavg()[0],
            "submitted_per_s": tasks / submit_s,
            "packed_per_s": tasks / packed_s,
            "packages": packages,
            "packages_per_s": packages / work_s,
            "lateness": {k: (statistics.median(v), max(v)) for k, v in late.items()},
        }
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        if engine == "postgres":
            conn = await asyncpg.connect(PG_ADMIN)
            await conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')
            await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--linger", type=int, nargs="+", default=[100, 500, 2000])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    engines = ["sqlite", "postgres"] if args.engine == "both" else [args.engine]
    for engine in engines:
        r = asyncio.run(bench_engine(engine, args.tasks, args.concurrency, args.linger, args.rounds))
        print(f"{r['engine']}: {r['tasks']} tasks, concurrency {args.concurrency} (load average {r['load']:.1f} on {os.cpu_count()} CPUs)")
        print(f"  baseline   {r['healthz_per_s']:8.1f} GET /healthz per s (the same server, same concurrency)")
        print(f"  submitted  {r['submitted_per_s']:8.1f} tasks/s")
        print(f"  packed     {r['packed_per_s']:8.1f} tasks/s (first submit → none pending)")
        print(f"  claimed+completed {r['packages_per_s']:8.1f} packages/s ({r['packages']} packages)")
        for linger, (median, worst) in r["lateness"].items():
            print(f"  flush lateness at linger_ms={linger}: median {median:.0f} ms, max {worst} ms ({args.rounds} flushes)")


if __name__ == "__main__":
    main()
