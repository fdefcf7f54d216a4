"""Benchmark of the batching face, on SQLite and PostgreSQL: over HTTP against a real `mainspring serve`
process, and the engine behind it through the library.

Measures, per engine, over HTTP (step ``http``):
- tasks/s submitted (HTTP 202s, C concurrent submitters, pairs of books) and tasks/s packed (until none pending):
  both bound by the submit request path, whose own floor is measured by ``bench/request_path.py``;
- packages/s claimed and completed (C concurrent workers, claim → complete);
- flush lateness vs linger_ms: when the dispatcher packed a pair, minus (the second task's arrival + linger_ms),
  read from the server's own timestamps (created_at / updated_at of the tasks).

And the engine (step ``engine``, in this process, on a database of its own with no server running):
- tasks/s submitted through the library (``service.submit_task``, C concurrent producers);
- tasks/s packed: the dispatcher's rounds (``dispatch_all``) over those tasks, already stored and pending,
  until none is pending — the work that runs after the 2xx, without the request path in front of it;
- packages/s claimed and completed through the library, as the in-process worker does
  (``cafe.claim`` → ``cafe.complete_package``, C concurrent workers).

    .venv/bin/python -m bench.batching --engine both --tasks 2000 --concurrency 16
    .venv/bin/python -m bench.batching --engine postgres --steps engine --engine-tasks 10000
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

from bench.pgcpu import DatabaseCpu
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


async def new_database(engine: str, tmp: Path, pg_name: str) -> str:
    if engine == "sqlite":
        return f"sqlite:///{tmp / 'mainspring.db'}"
    conn = await asyncpg.connect(PG_ADMIN)
    await conn.execute(f'CREATE DATABASE "{pg_name}"')
    await conn.close()
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + pg_name


async def drop_database(engine: str, tmp: Path, pg_name: str) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    if engine == "postgres":
        conn = await asyncpg.connect(PG_ADMIN)
        await conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')
        await conn.close()


async def row_updates(database: str) -> dict[str, tuple[int, int]]:
    """(updates, of them HOT) of the tasks' and packages' rows so far: a HOT update wrote no index entry. PostgreSQL's statistics arrive up to a second after the backends' last transaction."""
    await asyncio.sleep(1.5)
    conn = await asyncpg.connect(database)
    try:
        rows = await conn.fetch("SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                                " WHERE relname IN ('batch_tasks', 'batch_packages') ORDER BY relname DESC")
        return {r["relname"]: (r["n_tup_upd"], r["n_tup_hot_upd"]) for r in rows}
    finally:
        await conn.close()


async def bench_library(engine: str, tasks: int, concurrency: int) -> dict[str, Any]:
    """The engine through the library, no server: submit in bulk, then time the dispatcher packing what is
    stored, then claim + complete every package as the in-process worker does."""
    from mainspring.batching import cafe, dispatcher, service
    from mainspring.batching.models import BatcherSettingsIn, TaskIn
    from mainspring.store import Store
    from mainspring.store.migrate import migrate

    tmp = Path(tempfile.mkdtemp(prefix="bench-batching-engine-"))
    pg_name = f"bench_batching_engine_{uuid.uuid4().hex[:8]}"
    database = await new_database(engine, tmp, pg_name)
    store = Store(database, pool_size=concurrency, sqlite_synchronous="NORMAL")
    try:
        await migrate(store)
        name = "bench"
        await service.put_batcher(store, name, BatcherSettingsIn(min_size=2, max_size=6, linger_ms=50, max_wait_ms=600_000,
                                                                 group_size=2, incomplete_group="carry"))
        bodies = [TaskIn(id=f"{g}-{member}", group=str(g), member=member, content=f"book {g} in {member} " * 20)
                  for g in range(tasks // 2) for member in ("en", "ru")]
        queue = iter(bodies)

        async def producer() -> None:
            for body in queue:
                _task, accepted = await service.submit_task(store, name, body)
                assert accepted

        started = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(concurrency)))
        submit_s = time.perf_counter() - started

        started = time.perf_counter()
        rounds = 0
        while (await service.get_batcher(store, name))["counts"]["pending"]:
            due = await dispatcher.dispatch_all(store)
            rounds += 1
            if due is not None:  # the last pairs wait for their linger timer, as in the server's loop
                await asyncio.sleep(max(0, due - store.now_ms()) / 1000)
        packed_s = time.perf_counter() - started
        batcher = await service.get_batcher(store, name)
        assert batcher["counts"]["packed"] == len(bodies), batcher["counts"]
        packages = batcher["package_counts"]["ready"]

        done = 0

        async def worker(i: int) -> None:
            nonlocal done
            while True:
                package = await cafe.claim(store, name, f"w{i}", None, 0, 100)
                if package is None:
                    return
                await cafe.complete_package(store, package["id"], package["lease"]["token"],
                                            {t["id"]: {"ok": True} for t in package["tasks"]})
                done += 1

        packing_updates = await row_updates(database) if engine == "postgres" else {}
        pg_cpu = DatabaseCpu(database) if engine == "postgres" else None
        if pg_cpu is not None:
            await pg_cpu.start()
        cpu_before = time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        work_s = time.perf_counter() - started
        work_cpu_s = time.process_time() - cpu_before
        work_pg_s = await pg_cpu.stop() if pg_cpu is not None else 0.0
        assert done == packages, (done, packages)
        updates = {table: (n - packing_updates[table][0], hot - packing_updates[table][1])
                   for table, (n, hot) in (await row_updates(database) if engine == "postgres" else {}).items()}
        return {"updates": updates, "tasks": len(bodies), "submitted_per_s": len(bodies) / submit_s, "packed_per_s": len(bodies) / packed_s,
                "rounds": rounds, "packages": packages, "packages_per_s": packages / work_s,
                "cpu_us_per_package": work_cpu_s * 1e6 / packages, "pg_cpu_us_per_package": work_pg_s * 1e6 / packages}
    finally:
        await store.close()
        await drop_database(engine, tmp, pg_name)


async def bench_engine(engine: str, tasks: int, concurrency: int, lingers: list[int], rounds: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-batching-"))
    pg_name = f"bench_batching_{uuid.uuid4().hex[:8]}"
    database = await new_database(engine, tmp, pg_name)
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
        await drop_database(engine, tmp, pg_name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--linger", type=int, nargs="+", default=[100, 500, 2000])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", default="http,engine", help="http (through a server), engine (the library), or both")
    parser.add_argument("--engine-tasks", type=int, default=10000, help="tasks of the engine step")
    args = parser.parse_args()
    engines = ["sqlite", "postgres"] if args.engine == "both" else [args.engine]
    steps = set(args.steps.split(","))
    for engine in engines:
        if "engine" in steps:
            e = asyncio.run(bench_library(engine, args.engine_tasks, args.concurrency))
            print(f"{engine}: the engine through the library, {e['tasks']} tasks, concurrency {args.concurrency}"
                  f" (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
            print(f"  submitted  {e['submitted_per_s']:8.1f} tasks/s (service.submit_task)")
            print(f"  packed     {e['packed_per_s']:8.1f} tasks/s (stored and pending → none pending,"
                  f" {e['rounds']} dispatcher round(s))")
            print(f"  claimed+completed {e['packages_per_s']:8.1f} packages/s ({e['packages']} packages,"
                  " cafe.claim → cafe.complete_package)")
            print(f"  CPU per package claimed+completed: {e['cpu_us_per_package']:.0f} µs this process,"
                  f" {e['pg_cpu_us_per_package']:.0f} µs PostgreSQL's backends of its database")
            for table, (updated, hot) in e["updates"].items():
                print(f"  {table}: {updated} row updates by the claims and completions, {hot} of them HOT"
                      f" ({100 * hot / max(updated, 1):.0f} %: no index entry written)")
        if "http" not in steps:
            continue
        r = asyncio.run(bench_engine(engine, args.tasks, args.concurrency, args.linger, args.rounds))
        print(f"{r['engine']}: over HTTP, {r['tasks']} tasks, concurrency {args.concurrency} (load average {r['load']:.1f} on {os.cpu_count()} CPUs)")
        print(f"  baseline   {r['healthz_per_s']:8.1f} GET /healthz per s (the same server, same concurrency)")
        print(f"  submitted  {r['submitted_per_s']:8.1f} tasks/s")
        print(f"  packed     {r['packed_per_s']:8.1f} tasks/s (first submit → none pending: bound by the submits)")
        print(f"  claimed+completed {r['packages_per_s']:8.1f} packages/s ({r['packages']} packages)")
        for linger, (median, worst) in r["lateness"].items():
            print(f"  flush lateness at linger_ms={linger}: median {median:.0f} ms, max {worst} ms ({args.rounds} flushes)")


if __name__ == "__main__":
    main()
