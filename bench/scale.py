"""Issue 26: a big store — do pages, counts and starts stay fast? Run by hand, never in CI.

    # fill (once; SQL, not HTTP: generate_series on PostgreSQL, executemany on SQLite), then measure:
    .venv/bin/python bench/scale.py fill --database postgresql://postgres@127.0.0.1:5432/ms_scale --interactions 1000000
    .venv/bin/python bench/scale.py measure --database postgresql://postgres@127.0.0.1:5432/ms_scale
    .venv/bin/python bench/scale.py service --database postgresql://postgres@127.0.0.1:5432/ms_scale
    .venv/bin/python bench/scale.py explain --database postgresql://postgres@127.0.0.1:5432/ms_scale
    .venv/bin/python bench/scale.py ab --database postgresql://postgres@127.0.0.1:5432/ms_scale_ab

The fill creates the database (PostgreSQL) or file (SQLite), migrates it with ``mainspring migrate`` and
writes ``--interactions`` items over ``--queues`` queues, by id: per thousand, 900 completed, 20 failed,
10 cancelled, 50 ready, 10 scheduled (due in a day), 5 waiting, 5 processing (leased for a day).

``ab`` (PostgreSQL) measures what the kept counts and the list indexes cost the writes: on a fresh database,
with them and with them dropped (alternating, three rounds), the create p50 over 2,000 creates one at a time
and the CPU per create of this process and of its PostgreSQL backends, then a worker's processed/s and CPU
per item on 5,000 items.

``measure`` starts ``mainspring serve`` on the store (the time to its first ``/readyz`` 200 is the server
start: migrations checked and start-up recovery), then times each read of the aims (median of 5 after one
warm-up, wall time seen by the client on a loaded shared machine: ``uptime``'s load is printed beside) and
the create p50 (one connection, 200 creates). ``service`` times the same reads in-process, without HTTP.
``explain`` prints PostgreSQL's plan of the reads' statements.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from mainspring.core.metrics import REFRESH_S

ROOT = Path(__file__).resolve().parent.parent

# (state, next_processing relative to now or None, lease) per thousand, in id order.
MIX = [("completed", 900), ("failed", 20), ("cancelled", 10), ("ready", 50), ("scheduled", 10), ("waiting", 5),
       ("processing", 5)]
DAY_MS = 86_400_000


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0]


def _case(column: str) -> str:
    """SQL: the per-thousand bucket of row ``g`` mapped to ``column``'s value."""
    edges, bound = [], 0
    for status, share in MIX:
        bound += share
        edges.append((bound, status))
    values = {
        "state": {"ready": "'queued'", "scheduled": "'queued'", "waiting": "'queued'"},
        "next_processing": {"ready": ":now - 1000", "scheduled": f":now + {DAY_MS}", "waiting": "NULL",
                            "completed": "NULL", "failed": "NULL", "cancelled": "NULL", "processing": "NULL"},
        "finished_at": {"completed": ":now - 1000", "failed": ":now - 1000", "cancelled": ":now - 1000"},
        "lease_expires_at": {"processing": f":now + {DAY_MS}"},
        "lease_token": {"processing": "'bench-lease-token'"},
    }[column]
    arms = " ".join(f"WHEN g % 1000 < {b} THEN {values.get(s, repr(s) if column == 'state' else 'NULL')}"
                    for b, s in edges)
    return f"CASE {arms} END"


def fill_sql(queues: int) -> str:
    columns = ["state", "next_processing", "finished_at", "lease_expires_at", "lease_token"]
    return (
        'INSERT INTO interactions (queue, name, data, "user", source, attempts, created_at, updated_at, '
        + ", ".join(columns) + ") "
        f"SELECT 'q' || (g % {queues}), 'job', '{{\"n\": 1}}', 'user-' || (g % 97), 'bench', 1, "
        ":now - 1000, :now - 1000, " + ", ".join(_case(c) for c in columns) + " FROM generate_series(:lo, :hi) AS g"
    )


def migrate(database: str) -> None:
    subprocess.run([sys.executable, "-m", "mainspring.cli", "migrate", "--database", database], check=True,
                   cwd=ROOT)


async def fill_postgres(url: str, n: int, queues: int) -> None:
    import asyncpg

    admin, name = url.rsplit("/", 1)
    conn = await asyncpg.connect(admin + "/postgres")
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    migrate(url)
    conn = await asyncpg.connect(url)
    now = int(time.time() * 1000)
    sql = fill_sql(queues).replace(":now", str(now)).replace(":lo", "$1::bigint").replace(":hi", "$2::bigint")
    step = 250_000
    started = time.monotonic()
    for lo in range(0, n, step):
        await conn.execute(sql, lo, min(n, lo + step) - 1)
        print(f"  {min(n, lo + step):,} interactions, {time.monotonic() - started:.0f} s (load {load()})", flush=True)
    await conn.execute("VACUUM ANALYZE interactions")
    await conn.close()


def fill_sqlite(url: str, n: int, queues: int) -> None:
    path = Path(url.removeprefix("sqlite:///"))
    path.unlink(missing_ok=True)
    migrate(url)
    db = sqlite3.connect(path)
    now = int(time.time() * 1000)
    db.execute("CREATE TEMP TABLE g(g INTEGER PRIMARY KEY)")
    step = 100_000
    sql = fill_sql(queues).replace(":now", str(now)).replace("generate_series(:lo, :hi) AS g", "temp.g")
    started = time.monotonic()
    for lo in range(0, n, step):
        db.execute("DELETE FROM temp.g")
        db.executemany("INSERT INTO temp.g VALUES (?)", ((g,) for g in range(lo, min(n, lo + step))))
        db.execute(sql)
        db.commit()
        print(f"  {min(n, lo + step):,} interactions, {time.monotonic() - started:.0f} s (load {load()})", flush=True)
    db.execute("ANALYZE")
    db.close()


# --- measure ----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(database: str, data_dir: Path) -> tuple[subprocess.Popen[bytes], str, float]:
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mainspring.cli", "serve", "--port", str(port), "--database", database,
         "--data-dir", str(data_dir)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return proc, base, time.monotonic() - started
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(proc.stderr.read().decode() if proc.stderr else "server exited")
        time.sleep(0.02)


def timed(client: httpx.Client, path: str, runs: int = 5) -> tuple[float, Any]:
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code, response.text[:300])
    times = []
    for _ in range(runs):
        if path == "/metrics":
            time.sleep(REFRESH_S + 0.1)  # past the gauges' refresh interval: each scrape reads the store
        t = time.perf_counter()
        response = client.get(path)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000, response


def cursor_at(client: httpx.Client, path: str, pages: int) -> str | None:
    """A deep page's cursor: follow ``next_cursor`` with big pages, then the cursor of the last one."""
    cursor = None
    for _ in range(pages):
        sep = "&" if "?" in path else "?"
        body = client.get(f"{path}{sep}limit=1000" + (f"&cursor={cursor}" if cursor else "")).json()
        cursor = body.get("next_cursor") or cursor
    return cursor


def measure(database: str, queue: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc, base, start_s = start_server(database, Path(tmp) / "data")
        try:
            print(f"server start (to /readyz 200): {start_s * 1000:.0f} ms   (load {load()})")
            with httpx.Client(base_url=base, timeout=120) as client:
                reads = [
                    ("GET /healthz (the floor: no store)", "/healthz"),
                    ("GET /v1/queues/{q} (counts)", f"/v1/queues/{queue}"),
                    ("GET /metrics (uncached)", "/metrics"),
                    ("/ui/ overview", "/ui/"),
                    ("/ui/interactions", "/ui/interactions"),
                    ("/ui/interactions/queues/{q}", f"/ui/interactions/queues/{queue}"),
                    ("list, first page", f"/v1/queues/{queue}/interactions?limit=50"),
                ]
                for status in ("failed", "cancelled", "completed", "ready", "scheduled", "waiting", "processing"):
                    reads.append((f"list status={status}", f"/v1/queues/{queue}/interactions?status={status}&limit=50"))
                deep = cursor_at(client, f"/v1/queues/{queue}/interactions", 20)
                if deep:
                    reads.append(("list, deep page (20,000 in)", f"/v1/queues/{queue}/interactions?limit=50&cursor={deep}"))
                deep = cursor_at(client, f"/v1/queues/{queue}/interactions?status=failed", 2)
                if deep:
                    reads.append(("list status=failed, deep page", f"/v1/queues/{queue}/interactions?status=failed&limit=50&cursor={deep}"))
                for what, path in reads:
                    ms, _ = timed(client, path)
                    print(f"{what:<40} {ms:8.1f} ms   (load {load()})", flush=True)
                latencies = []
                for i in range(200):
                    t = time.perf_counter()
                    response = client.post("/v1/queues/bench-create/interactions", json={"data": {"i": i}})
                    latencies.append(time.perf_counter() - t)
                    assert response.status_code == 201, response.text
                print(f"{'create, 1 connection, p50':<40} {statistics.median(latencies) * 1000:8.2f} ms   (load {load()})")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


EXPLAINED = {
    "queue counts": "SELECT * FROM interaction_counts WHERE queue = 'q0'",
    "scheduled (capped)": "SELECT count(*) FROM (SELECT 1 FROM interactions WHERE queue = 'q0' AND state = 'queued' "
                          "AND next_processing > {now} LIMIT 10001) AS s",
    "list status=failed": "SELECT * FROM interactions WHERE queue = 'q0' AND state = 'failed' ORDER BY id LIMIT 51",
    "list status=ready": "SELECT * FROM interactions WHERE queue = 'q0' AND state = 'queued' AND next_processing <= {now} "
                         "ORDER BY id LIMIT 51",
    "list status=waiting": "SELECT * FROM interactions WHERE queue = 'q0' AND state = 'queued' AND next_processing IS NULL "
                           "ORDER BY id LIMIT 51",
    "list status=processing": "SELECT * FROM interactions WHERE queue = 'q0' AND state = 'processing' ORDER BY id LIMIT 51",
    "list status=completed": "SELECT * FROM interactions WHERE queue = 'q0' AND state = 'completed' ORDER BY id LIMIT 51",
    "oldest ready (metrics)": "SELECT min(next_processing) FROM interactions WHERE queue = 'q0' AND state = 'queued' "
                              "AND next_processing <= {now}",
    "latency chart (overview)": "SELECT (finished_at - {now}) / 60000, avg(finished_at - created_at) FROM interactions "
                                "WHERE finished_at IS NOT NULL AND finished_at > {now} - 3600000 GROUP BY 1",
    "list, deep page": "SELECT * FROM interactions WHERE queue = 'q0' AND id > 500000 ORDER BY id LIMIT 51",
}


async def explain(url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    now = int(time.time() * 1000)
    for what, sql in EXPLAINED.items():
        plan = await conn.fetch("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql.format(now=now))
        print(f"-- {what}\n" + "\n".join(r[0] for r in plan))
    await conn.close()


async def service_times(url: str) -> None:
    """The read paths timed in this process (median of 5 after one): what the store and the service spend,
    without the HTTP client and server sharing the loaded machine's cores."""
    from mainspring.interactions import service
    from mainspring.interactions.settings import InteractionsSettings
    from mainspring.store import Store

    store = Store(url, pool_size=2)
    await store.start()
    cfg = InteractionsSettings()
    now = store.now_ms()
    reads = {
        "queue counts (get_queue)": lambda: service.get_queue(store, cfg, "q0"),
        "all counts (overview, /metrics)": lambda: service.count_by_status(store),
        "latency chart (60 minutes)": lambda: service.mean_latency_by_bucket(store, now - 3_600_000, now, 60_000),
        **{f"list status={s}": (lambda s=s: service.list_items(store, "q0", {"status": [s]}, 50, None))
           for s in ("failed", "processing", "waiting", "ready", "scheduled", "completed")},
    }
    try:
        for what, read in reads.items():
            await read()
            times = []
            for _ in range(5):
                t = time.perf_counter()
                await read()
                times.append((time.perf_counter() - t) * 1000)
            print(f"{what:<40} {statistics.median(times):8.1f} ms   (load {load()})", flush=True)
    finally:
        await store.close()


# --- ab: the write path's cost of the kept counts and the list indexes ---------------------------------------

WITHOUT = [
    "DROP TRIGGER interactions_count_insert ON interactions", "DROP TRIGGER interactions_count_delete ON interactions",
    "DROP TRIGGER interactions_count_update ON interactions", "DROP INDEX ix_interactions_queued_by_id",
    "DROP INDEX ix_interactions_few_by_id",
]


async def ab_round(url: str, with_counts: bool, creates: int, jobs: int) -> dict[str, float]:
    """On a fresh database: ``creates`` creates one at a time (p50, CPU of this process and of its PostgreSQL
    backends per create), then a worker processing ``jobs`` items (processed/s, CPU per item)."""
    import asyncpg

    sys.path.insert(0, str(ROOT / "bench"))
    from pgcpu import backends_cpu_s

    from mainspring.app import App
    from mainspring.interactions import service
    from mainspring.interactions.settings import InteractionsSettings
    from mainspring.interactions.worker import Worker
    from mainspring.store import Store
    from mainspring.store.migrate import migrate as migrate_store

    admin, name = url.rsplit("/", 1)
    conn = await asyncpg.connect(admin + "/postgres")
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    cfg = InteractionsSettings()
    store = Store(url, pool_size=4)
    await migrate_store(store)
    if not with_counts:
        conn = await asyncpg.connect(url)
        for statement in WITHOUT:
            await conn.execute(statement)
        await conn.close()
    await store.start()
    try:
        for i in range(50):  # warm the pool and the statement caches
            await service.create(store, cfg, "warm", {"data": {"i": i}})
        conn = await asyncpg.connect(url)
        pids = {r[0] for r in await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", name)}
        await conn.close()
        latencies = []
        cpu, pg = time.process_time(), backends_cpu_s(pids)
        for i in range(creates):
            t = time.perf_counter()
            await service.create(store, cfg, "bench", {"data": {"i": i}})
            latencies.append(time.perf_counter() - t)
        result = {"create_p50_ms": statistics.median(latencies) * 1000,
                  "create_cpu_us": (time.process_time() - cpu) / creates * 1e6,
                  "create_pg_cpu_us": (backends_cpu_s(pids) - pg) / creates * 1e6}
        for start in range(0, jobs, 1000):
            await service.create_many(store, cfg, "work", [{"data": {"n": i}} for i in range(start, min(jobs, start + 1000))])
        done = asyncio.Event()
        handled = 0
        app = App()

        @app.queue("work")
        async def noop(item: Any) -> None:
            nonlocal handled
            handled += 1
            if handled >= jobs:
                done.set()

        worker = Worker(store, app, cfg, poll_ms=1000)
        began, cpu = time.perf_counter(), time.process_time()
        await worker.start()
        await asyncio.wait_for(done.wait(), 600)
        await worker.stop()
        result["processed_per_s"] = jobs / (time.perf_counter() - began)
        result["worker_cpu_us"] = (time.process_time() - cpu) / jobs * 1e6
        return result
    finally:
        await store.close()


async def ab(url: str, rounds: int, creates: int, jobs: int) -> None:
    for r in range(rounds):
        for with_counts in (True, False):
            measured = await ab_round(url, with_counts, creates, jobs)
            label = "counts+indexes" if with_counts else "without      "
            print(f"round {r} {label} " + "  ".join(f"{k} {v:.1f}" for k, v in measured.items()) + f"   (load {load()})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["fill", "measure", "service", "explain", "ab"])
    parser.add_argument("--database", required=True)
    parser.add_argument("--interactions", type=int, default=1_000_000)
    parser.add_argument("--queues", type=int, default=5)
    args = parser.parse_args()
    print(f"{args.command} {args.database} at {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {load()}")
    if args.command == "fill":
        started = time.monotonic()
        if args.database.startswith("postgresql"):
            asyncio.run(fill_postgres(args.database, args.interactions, args.queues))
        else:
            fill_sqlite(args.database, args.interactions, args.queues)
        print(f"filled in {time.monotonic() - started:.0f} s")
    elif args.command == "measure":
        measure(args.database, "q0")
    elif args.command == "service":
        asyncio.run(service_times(args.database))
    elif args.command == "ab":
        asyncio.run(ab(args.database, 3, 2000, 5000))
    else:
        asyncio.run(explain(args.database))


if __name__ == "__main__":
    main()
