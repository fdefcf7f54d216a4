"""Workflows beside DBOS Transact, the same workloads in one run, alternated, on both engines (issue 33's aims).

    .venv/bin/python bench/workflows.py --pg postgresql://postgres@127.0.0.1:5432/postgres            # both systems
    .venv/bin/python bench/workflows.py --only mainspring --engine sqlite --many 500 --lone 50        # one side

DBOS is not a Mainspring dependency: it runs from its own venv, made once (``bench/.dbos-venv``, ``pip install
dbos psycopg[binary]``) and used by a child process of this script (``--dbos-python``). Each workload runs in a
fresh process and a fresh database; the sides alternate, A B A B. Prints one JSON line per measurement:

- ``many``: N workflows of 10 no-op async steps started at once, their results awaited: workflows/s, steps/s;
- ``lone``: M runs one after another, start → result: p50 / p99 ms;
- ``long`` (Mainspring): one run of 1,000 steps: the 10th step's cost and the 1,000th's (ms, mean of 10 around each);
- ``sleepers`` (Mainspring): K runs sleeping 2 s, then woken: all complete; wake lateness p50 / p99 ms;
- ``waiters`` (Mainspring): W runs waiting for a signal: the server's RSS above idle (MB).
With each, the process CPU per workflow (µs) and the load (``os.getloadavg``): the machine may be shared.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STEPS = 10


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# --- Mainspring, in-process (the server's own runner, as `serve --app` runs it) ---------------------------------------


async def mainspring(workload: str, url: str, size: int) -> dict[str, Any]:
    from mainspring import App, Workflow
    from mainspring.api import create_app
    from mainspring.config import load_settings
    from mainspring.store import Store
    from mainspring.store.migrate import migrate
    from mainspring.workflows import service

    full_collections: list[float] = []
    collecting = [0.0]

    def timed_collection(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            collecting[0] = time.perf_counter()
        else:
            full_collections.append((time.perf_counter() - collecting[0]) * 1000)

    gc.callbacks.append(timed_collection)
    app = App()
    done: dict[str, asyncio.Future[Any]] = {}
    step_times: list[float] = []
    step_cpu: list[float] = []
    lateness: list[float] = []

    async def noop() -> None:
        return None

    @app.workflow("ten")
    async def ten(wf: Workflow, args: Any) -> int:
        for _ in range(STEPS):
            await wf.step(noop)
        done[wf.id].set_result(None)
        return STEPS

    @app.workflow("long")
    async def long(wf: Workflow, args: Any) -> int:
        for _ in range(args):
            began, cpu = time.perf_counter(), time.process_time()
            await wf.step(noop)
            step_times.append(time.perf_counter() - began)
            step_cpu.append(time.process_time() - cpu)
        done[wf.id].set_result(None)
        return int(args)

    @app.workflow("sleeper")
    async def sleeper(wf: Workflow, args: Any) -> None:
        due = wf.now() + 2000
        await wf.sleep(2000)
        lateness.append(time.time() * 1000 - due)
        done[wf.id].set_result(None)

    @app.workflow("waiter")
    async def waiter(wf: Workflow, args: Any) -> Any:
        return await wf.wait("go")

    store = Store(url, pool_size=10)
    await migrate(store)
    settings = load_settings(None, server={"database": url})
    # As ``mainspring serve`` runs it (``own_process``: start-up's heap frozen out of the collector). Embedded
    # (MAINSPRING_BENCH_EMBEDDED=1, what this bench did before 2026-11-29-wflat), a full collection walks the
    # ~160,000 objects of start-up every few hundred runs: 100–250 ms, the lone runs' p99.
    embedded = os.environ.get("MAINSPRING_BENCH_EMBEDDED") == "1"
    server = create_app(settings, store=store, registry=app, own_process=not embedded)
    ctx = server.state.context
    async with server.router.lifespan_context(server):
        cpu0 = time.process_time()
        full_collections.clear()

        async def run(name: str, args: Any = None) -> None:
            run_id = uuid.uuid4().hex
            done[run_id] = asyncio.get_running_loop().create_future()
            await service.start_run(ctx, name, run_id, args)
            await done[run_id]

        if workload == "many":
            trips0 = store.backend.round_trips
            began = time.perf_counter()
            await asyncio.gather(*(run("ten") for _ in range(size)))
            took = time.perf_counter() - began
            # Round trips on PostgreSQL (statements and commits on SQLite): how well the runs' records share them.
            trips = store.backend.round_trips - trips0
            return {"workflows_per_s": size / took, "steps_per_s": size * STEPS / took,
                    "cpu_us_per_workflow": (time.process_time() - cpu0) / size * 1e6,
                    "round_trips_per_record": trips / (size * (STEPS + 2))}
        if workload == "lone":
            trips0 = store.backend.round_trips
            times = []
            for _ in range(size):
                began = time.perf_counter()
                await run("ten")
                times.append((time.perf_counter() - began) * 1000)
            return {"p50_ms": statistics.median(times), "p99_ms": quantile(times, 0.99),
                    "cpu_us_per_workflow": (time.process_time() - cpu0) / size * 1e6, "round_trips_per_run": (store.backend.round_trips - trips0) / size,
                    "full_gcs": len(full_collections), "full_gc_max_ms": max(full_collections, default=0.0)}
        if workload == "long":
            await run("long", size)
            # Wall time per step is the machine's load as much as ours; CPU per step (this process, one run) is not.
            tenth = statistics.mean(step_times[5:15]) * 1000
            last = statistics.mean(step_times[-10:]) * 1000
            cpu_tenth = statistics.mean(step_cpu[5:15]) * 1e6
            cpu_last = statistics.mean(step_cpu[-10:]) * 1e6
            return {"step_10_ms": tenth, f"step_{size}_ms": last, "ratio": last / tenth,
                    "step_10_cpu_us": cpu_tenth, f"step_{size}_cpu_us": cpu_last, "cpu_ratio": cpu_last / cpu_tenth}
        if workload == "sleepers":
            trips0 = store.backend.round_trips
            await asyncio.gather(*(run("sleeper") for _ in range(size)))
            # Each run writes 4 records besides its start (now + sleep, woke, end) in 3 steps of its machine.
            return {"completed": len(lateness), "lateness_p50_ms": quantile(lateness, 0.5), "lateness_p99_ms": quantile(lateness, 0.99),
                    "full_gcs": len(full_collections), "full_gc_max_ms": max(full_collections, default=0.0),
                    "cpu_us_per_workflow": (time.process_time() - cpu0) / size * 1e6, "round_trips_per_run": (store.backend.round_trips - trips0) / size,
                    "kept_coroutines": len(service.runner_of(ctx).parked)}
        if workload == "waiters":
            idle = rss_mb()
            for chunk in range(0, size, 500):
                await asyncio.gather(*(service.start_run(ctx, "waiter", f"w{i}", None) for i in range(chunk, min(size, chunk + 500))))
            while len(service.runner_of(ctx).active):  # noqa: ASYNC110 - the runner has no event for "all parked"; a bench may poll
                await asyncio.sleep(0.1)
            parked = rss_mb()
            return {"runs": size, "rss_above_idle_mb": parked - idle, "kept_coroutines": len(service.runner_of(ctx).parked),
                    "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    raise ValueError(workload)


# --- DBOS 3.4, in its own venv --------------------------------------------------------------------------------------------


DBOS_CHILD = r'''
import asyncio, json, statistics, sys, time, uuid
from dbos import DBOS
workload, url, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
DBOS(config={"name": "bench", "system_database_url": url})

@DBOS.step()
async def noop() -> None:
    return None

@DBOS.workflow()
async def ten() -> int:
    for _ in range(10):
        await noop()
    return 10

async def main():
    DBOS.launch()
    cpu0 = time.process_time()
    if workload == "many":
        began = time.perf_counter()
        handles = await asyncio.gather(*(DBOS.start_workflow_async(ten) for _ in range(size)))
        await asyncio.gather(*(h.get_result() for h in handles))
        took = time.perf_counter() - began
        out = {"workflows_per_s": size / took, "steps_per_s": size * 10 / took, "cpu_us_per_workflow": (time.process_time() - cpu0) / size * 1e6}
    else:
        times = []
        for _ in range(size):
            began = time.perf_counter()
            handle = await DBOS.start_workflow_async(ten)
            await handle.get_result()
            times.append((time.perf_counter() - began) * 1000)
        times.sort()
        out = {"p50_ms": statistics.median(times), "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))],
               "cpu_us_per_workflow": (time.process_time() - cpu0) / size * 1e6}
    print(json.dumps(out))
    DBOS.destroy()

asyncio.run(main())
'''


def dbos(python: str, workload: str, url: str, size: int) -> dict[str, Any]:
    done = subprocess.run([python, "-c", DBOS_CHILD, workload, url, str(size)], capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# --- databases and the alternation ---------------------------------------------------------------------------------------


def fresh_database(engine: str, pg_admin: str, tmp: Path) -> tuple[str, str, Any]:
    """(Mainspring URL, DBOS URL, drop) of a new database."""
    if engine == "sqlite":
        path = tmp / f"{uuid.uuid4().hex[:8]}.db"
        return f"sqlite:///{path}", f"sqlite:///{path}", lambda: None
    import asyncpg

    name = f"msbench_wf_{uuid.uuid4().hex[:8]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(pg_admin)
        await conn.execute(sql)
        await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    url = pg_admin.rsplit("/", 1)[0] + "/" + name
    return url, url, lambda: asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def child(system: str, workload: str, engine: str, size: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs, drop = fresh_database(engine, args.pg, Path(tmp))
        try:
            if system == "dbos":
                result = dbos(args.dbos_python, workload, theirs, size)
            else:
                done = subprocess.run([sys.executable, __file__, "--child", workload, ours, str(size)], capture_output=True, text=True,
                                      timeout=3600, check=False)
                result = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-2000:]}
        finally:
            drop()
    return {"system": system, "engine": engine, "workload": workload, "size": size, **result, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--only", choices=["mainspring", "dbos"])
    parser.add_argument("--dbos-python", default=str(HERE / ".dbos-venv" / "bin" / "python"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--many", type=int, default=500)
    parser.add_argument("--lone", type=int, default=50)
    parser.add_argument("--long", type=int, default=1000)
    parser.add_argument("--sleepers", type=int, default=10_000)
    parser.add_argument("--waiters", type=int, default=100_000)
    parser.add_argument("--workloads", default="many,lone,long,sleepers,waiters")
    parser.add_argument("--child", nargs=3, metavar=("WORKLOAD", "URL", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        workload, url, size = args.child
        print(json.dumps(asyncio.run(mainspring(workload, url, int(size)))))
        return
    engines = ["sqlite", "postgres"] if args.engine == "both" else [args.engine]
    systems = [args.only] if args.only else ["dbos", "mainspring"]
    for engine in engines:
        for workload in args.workloads.split(","):
            size = getattr(args, workload)
            for _ in range(args.rounds):
                for system in systems:
                    if system == "dbos" and workload not in ("many", "lone"):
                        continue
                    print(json.dumps(child(system, workload, engine, size, args)), flush=True)


if __name__ == "__main__":
    main()
