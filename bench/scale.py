"""Issue 26: a big store — do pages, counts and starts stay fast? Run by hand, never in CI.

    # fill (once; SQL, not HTTP: generate_series on PostgreSQL, executemany on SQLite), then measure:
    .venv/bin/python -m bench.scale fill --database postgresql://postgres@127.0.0.1:5432/ms_scale --interactions 1000000
    .venv/bin/python -m bench.scale measure --database postgresql://postgres@127.0.0.1:5432/ms_scale
    .venv/bin/python -m bench.scale service --database postgresql://postgres@127.0.0.1:5432/ms_scale
    .venv/bin/python -m bench.scale explain --database postgresql://postgres@127.0.0.1:5432/ms_scale
    .venv/bin/python -m bench.scale ab --database postgresql://postgres@127.0.0.1:5432/ms_scale_ab
    .venv/bin/python -m bench.scale soak --database postgresql://postgres@127.0.0.1:5432/ms_scale_soak --minutes 30

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

``soak`` (PostgreSQL, a fresh database) runs ``mainspring serve`` with retention shortened (finished items and
events kept ``--retention-s``, pruned every 10 s), creates ``--rate`` interactions a second over HTTP (bulk
calls of a tenth of a second's worth, paced by the clock) while a worker in this process completes them, and
every 30 s samples the size of every table and index (``pg_relation_size``), live and dead tuples and
autovacuum runs (``pg_stat_user_tables``) and the plan of the hot statements (``SOAK_EXPLAINED``: a Seq Scan
on a hot table is flagged). It writes ``bench/soak.csv`` (one row per sample and measure) and
``bench/soak.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from bench import ROOT
from bench.pgcpu import backends_cpu_s
from mainspring.core.metrics import REFRESH_S

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


async def fresh_database(url: str) -> None:
    """PostgreSQL: drop and create the database of ``url`` (its connections closed first)."""
    import asyncpg

    admin, name = url.rsplit("/", 1)
    conn = await asyncpg.connect(admin + "/postgres")
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()


async def fill_postgres(url: str, n: int, queues: int) -> None:
    import asyncpg

    await fresh_database(url)
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


# --- fill-faces: machines, exchange and batching, as their services would have written them (PostgreSQL) ---

FACES_FILL = {
    # 98 % working, 2 % failed; 4 namespaces; each machine with 10 history events, and its events in the log.
    "machines": [
        "INSERT INTO machines (namespace, id, status, version, last_event_id, retry_attempt, created_at, updated_at, error) "
        "SELECT 'ns' || (g % 4), 'm' || g, CASE WHEN g % 50 = 0 THEN 'failed' ELSE 'working' END, 10, 10, 0, :now - 1000, "
        ":now - 1000, CASE WHEN g % 50 = 0 THEN jsonb_build_object('kind', 'call', 'code', 'processor_refused', "
        "'detail', 'bench', 'permanent', true, 'at', '2026-11-27T00:00:00.000Z') END FROM generate_series(:lo, :hi) AS g",
        "INSERT INTO machine_history (machine_uid, event_id, created_at, data) SELECT m.uid, e, :now - 1000, "
        "jsonb_build_object('step', e) FROM machines m, generate_series(1, 10) AS e "
        "WHERE m.uid > (SELECT coalesce(max(machine_uid), 0) FROM machine_history)",  # this round's machines
        "INSERT INTO events (type, at, subject_kind, subject_id, data) SELECT CASE WHEN e = 0 THEN 'machine.created' "
        "ELSE 'machine.event' END, :now - 1000, 'machine', 'ns' || (g % 4) || '/m' || g, CASE WHEN e = 0 THEN "
        "jsonb_build_object('namespace', 'ns' || (g % 4), 'id', 'm' || g) ELSE jsonb_build_object('namespace', "
        "'ns' || (g % 4), 'id', 'm' || g, 'event_id', e, 'data', jsonb_build_object('step', e)) END "
        "FROM generate_series(:lo, :hi) AS g, generate_series(0, 10) AS e",
    ],
    # Messages in 1,000 mailboxes: 95 % taken by a process that committed (GONE, the process DONE: ten
    # messages a process), 5 % AVAILABLE (rows only: their files are not written, nothing reads them here).
    "exchange": [
        "INSERT INTO exchange_processes (id, addressee, database, client_id, message_ids, state, started_at, updated_at) "
        "SELECT 'p' || (g / 10), 'mobile-' || (g % 1000), 'db', 'bench', jsonb_build_array('x' || g), 'DONE', "
        ":now - 2000, :now - 1000 FROM generate_series(:lo, :hi) AS g WHERE g % 10 = 0 AND g % 100 < 95",
        "INSERT INTO exchange_messages (id, addressee, database, size, sha256, content_type, created_at, state, "
        "process_id, path, synced) SELECT 'x' || g, 'mobile-' || (g % 1000), 'db', 5, md5(g::text) || md5(g::text), "
        "'application/octet-stream', :now - 3000, CASE WHEN g % 100 < 95 THEN 'GONE' ELSE 'AVAILABLE' END, "
        "CASE WHEN g % 100 < 95 THEN 'p' || (g / 10 * 10 / 10) END, CASE WHEN g % 100 >= 95 THEN 'bench/x' || g END, "
        "true FROM generate_series(:lo, :hi) AS g",
        "INSERT INTO events (type, at, subject_kind, subject_id, data) SELECT 'exchange.message.stored', :now - 3000, "
        "'exchange.message', 'x' || g, jsonb_build_object('addressee', 'mobile-' || (g % 1000), 'database', 'db') "
        "FROM generate_series(:lo, :hi) AS g",
    ],
    # Tasks of 4 batchers in pairs (group, en/ru): 98 % done in packages of 100, 2 % pending; the version log.
    "batching": [
        "INSERT INTO batch_packages (id, batcher, status, size, attempts, created_at, updated_at) SELECT 'pk' || (g / 100), "
        "'b' || (g / 100 % 4), 'done', 100, 1, :now - 2000, :now - 1000 FROM generate_series(:lo, :hi) AS g "
        "WHERE g % 100 = 0 AND g % 10000 < 9800",
        "INSERT INTO batch_tasks (batcher, id, \"group\", member, sha256, version, status, package_id, content, created_at, "
        "updated_at) SELECT 'b' || (g / 100 % 4), 't' || g, 'g' || (g / 2), CASE WHEN g % 2 = 0 THEN 'en' ELSE 'ru' END, "
        "md5(g::text) || md5(g::text), 1, CASE WHEN g % 10000 < 9800 THEN 'done' ELSE 'pending' END, "
        "CASE WHEN g % 10000 < 9800 THEN 'pk' || (g / 100) END, to_jsonb('text ' || g), :now - 3000, :now - 1000 "
        "FROM generate_series(:lo, :hi) AS g",
        "INSERT INTO batch_versions (batcher, \"group\", member, version, sha256, task_id, at) SELECT 'b' || (g / 100 % 4), "
        "'g' || (g / 2), CASE WHEN g % 2 = 0 THEN 'en' ELSE 'ru' END, 1, md5(g::text) || md5(g::text), 't' || g, :now - 3000 "
        "FROM generate_series(:lo, :hi) AS g",
        "INSERT INTO events (type, at, subject_kind, subject_id, data) SELECT 'batch.task.packed', :now - 2000, 'batch_task', "
        "'b' || (g / 100 % 4) || '/t' || g, jsonb_build_object('package_id', 'pk' || (g / 100)) "
        "FROM generate_series(:lo, :hi) AS g WHERE g % 10000 < 9800",
    ],
}


async def fill_faces(url: str, n: int, faces: list[str]) -> None:
    """Each face's ``n`` rows (machines, exchange messages, batching tasks) by SQL on a migrated store; the
    namespaces and batchers through the API first (their settings as the service writes them)."""
    import asyncpg

    with tempfile.TemporaryDirectory() as tmp:
        proc, base, _ = start_server(url, Path(tmp) / "data")
        try:
            with httpx.Client(base_url=base, timeout=60) as client:  # set-up before the timed part: blocking is fine here
                for i in range(4):
                    assert client.put(f"/v1/namespaces/ns{i}", json={"processor": {"timeout_ms": 2000}}).status_code == 200  # noqa: ASYNC212
                    assert client.put(f"/v1/batchers/b{i}", json={  # noqa: ASYNC212
                        "min_size": 100, "max_size": 100, "linger_ms": 5000, "max_wait_ms": 30 * DAY_MS, "group_size": 2,
                        "incomplete_group": "reject", "lease_ms": 10000}).status_code == 200
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    conn = await asyncpg.connect(url)
    now = int(time.time() * 1000)
    step = 100_000
    started = time.monotonic()
    for face in faces:
        for lo in range(0, n, step):
            for sql in FACES_FILL[face]:
                bounds = (lo, min(n, lo + step) - 1) if ":lo" in sql else ()
                await conn.execute(sql.replace(":now", str(now)).replace(":lo", "$1::bigint").replace(":hi", "$2::bigint"),
                                   *bounds)
            print(f"  {face}: {min(n, lo + step):,}, {time.monotonic() - started:.0f} s (load {load()})", flush=True)
    await conn.execute("VACUUM ANALYZE")
    await conn.close()


async def upgrade_cost(url: str) -> None:
    """What machines_0006, exchange_0003, batching_0004 and core_0008 cost on this (filled) store: each counts table is
    dropped and made again as its migration makes it — triggers created and the rows counted, writes to
    the face's tables waiting on the lock meanwhile — timed, in one transaction each (the store is left as
    the migration would leave it)."""
    import importlib.util

    import asyncpg

    from mainspring.store.counts import AUTOVACUUM

    conn = await asyncpg.connect(url)
    versions = ROOT / "src/mainspring/store/migrations/versions"
    for file, table in (("machines_0006_kept_counts", "machine_counts"), ("exchange_0003_kept_counts", "exchange_counts"),
                        ("batching_0004_kept_counts", "batching_counts"),
                        ("core_0008_event_counts_per_minute", "event_counts")):
        spec = importlib.util.spec_from_file_location(file, versions / f"{file}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        async with conn.transaction():
            for kept in module.KEPT:
                for statement in kept.uninstall(postgres=True):
                    await conn.execute(statement)
            await conn.execute(f"DROP TABLE {table}")
        started = time.monotonic()
        async with conn.transaction():
            await conn.execute(f"CREATE TABLE {table} (kind varchar(32) NOT NULL, grp varchar(1024) NOT NULL, "
                               f"status varchar(32) NOT NULL, slot integer NOT NULL, n bigint NOT NULL, "
                               f"CONSTRAINT pk_{table} PRIMARY KEY (kind, grp, status, slot))")
            await conn.execute(f"ALTER TABLE {table} SET ({AUTOVACUUM})")
            for kept in module.KEPT:
                for statement in kept.install(postgres=True):
                    await conn.execute(statement)
        rows = int(await conn.fetchval(f"SELECT coalesce(sum(n), 0) FROM {table}"))
        print(f"{file}: {time.monotonic() - started:.2f} s holding the lock, {rows:,} rows counted (load {load()})", flush=True)
    await conn.close()


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


def time_reads(client: httpx.Client, reads: list[tuple[str, str]]) -> None:
    for what, path in reads:
        ms, _ = timed(client, path)
        print(f"{what:<48} {ms:8.1f} ms   (load {load()})", flush=True)


def measure_faces(database: str) -> None:
    """The dashboard pages and API lists of machines, exchange and batching (after ``fill-faces``), and the
    counts each reads; deep pages by the lists' own cursors."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, base, start_s = start_server(database, Path(tmp) / "data")
        try:
            print(f"server start (to /readyz 200): {start_s * 1000:.0f} ms   (load {load()})")
            with httpx.Client(base_url=base, timeout=120) as client:
                reads = [("GET /healthz (the floor)", "/healthz"), ("GET /metrics (uncached)", "/metrics"),
                         ("/ui/ overview", "/ui/"), ("/ui/events", "/ui/events"), ("GET /v1/events", "/v1/events?limit=50")]
                deep = cursor_at(client, "/v1/events", 20)
                if deep:
                    reads.append(("GET /v1/events, deep page (20,000 in)", f"/v1/events?limit=50&after={deep}"))
                reads += [
                    ("/ui/machines", "/ui/machines"), ("/ui/machines?status=failed", "/ui/machines?status=failed"),
                    ("/ui/machines/namespaces/ns0", "/ui/machines/namespaces/ns0"), ("/ui/machines/ns0/m4", "/ui/machines/ns0/m4"),
                    ("GET /v1/namespaces/ns0 (counts)", "/v1/namespaces/ns0"),
                    ("GET machines list", "/v1/namespaces/ns0/machines?limit=50"),
                    ("GET machines list status=failed", "/v1/namespaces/ns0/machines?status=failed&limit=50"),
                    ("GET /v1/namespaces/ns0/machines/m4", "/v1/namespaces/ns0/machines/m4"),
                    ("/ui/exchange", "/ui/exchange"), ("/ui/exchange?state=DONE", "/ui/exchange?state=DONE"),
                    ("/ui/exchange/mailboxes/mobile-5/db", "/ui/exchange/mailboxes/mobile-5/db"),
                    ("/ui/exchange/processes/p5", "/ui/exchange/processes/p5"),
                    ("GET API_1 mailbox messages", "/v1/exchange/mailboxes/mobile-5/db/messages?limit=50"),
                    ("GET processes state=DONE", "/v1/exchange/processes?state=DONE"),
                    ("GET processes of a mailbox", "/v1/exchange/processes?addressee=mobile-5&database=db"),
                    ("/ui/batching", "/ui/batching"), ("/ui/batching/b0", "/ui/batching/b0"),
                    ("GET /v1/batchers/b0 (counts)", "/v1/batchers/b0"),
                    ("GET a task", "/v1/batchers/b0/tasks/t5"),
                    ("GET group versions", "/v1/batchers/b0/versions/g2"),
                ]
                for path in ("/v1/namespaces/ns0/machines", "/v1/exchange/processes?state=DONE"):
                    deep = cursor_at(client, path, 20)
                    if deep:
                        sep = "&" if "?" in path else "?"
                        reads.append((f"GET {path} deep page", f"{path}{sep}limit=50&cursor={deep}"))
                time_reads(client, reads)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


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
                time_reads(client, reads)
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


async def gauge_times(url: str, runs: int = 5) -> None:
    """What ``GET /metrics`` (uncached) spends in the store: each gauge reader timed in this process (median of
    ``runs`` after one), and each statement it sent (the median run's, by SQLAlchemy's cursor events)."""
    from sqlalchemy import event

    from mainspring.api import FACES
    from mainspring.config import load_settings
    from mainspring.core.metrics import Gauges, read_alert_gauges, read_outbox_gauges
    from mainspring.core.runtime import Context
    from mainspring.store import Store

    settings = load_settings(None, server={"database": url})
    store = Store(url, pool_size=settings.server.pool_size)  # as the server's
    await store.start()
    ctx = Context(settings=settings, store=store)
    readers = {"outbox": read_outbox_gauges, "alerts": read_alert_gauges,
               **{face.name: face.read_gauges for face in FACES if face.read_gauges is not None}}
    sent: list[tuple[str, float]] = []
    started: dict[int, float] = {}

    def before(_conn: Any, cursor: Any, *_args: Any) -> None:
        started[id(cursor)] = time.perf_counter()

    def after(_conn: Any, cursor: Any, statement: str, *_args: Any) -> None:
        sent.append((" ".join(statement.split())[:100], (time.perf_counter() - started.pop(id(cursor), 0.0)) * 1000))

    sync_engine = store.backend.engine.sync_engine  # type: ignore[attr-defined]
    event.listen(sync_engine, "before_cursor_execute", before)
    event.listen(sync_engine, "after_cursor_execute", after)
    try:
        total = 0.0
        for name, read in readers.items():
            await read(ctx)
            runs_sent, times = [], []
            for _ in range(runs):
                sent.clear()
                t = time.perf_counter()
                await read(ctx)
                times.append((time.perf_counter() - t) * 1000)
                runs_sent.append(list(sent))
            median = statistics.median(times)
            total += median
            print(f"{name:<14} {median:7.1f} ms   (load {load()})", flush=True)
            for statement, ms in runs_sent[times.index(median)] if median in times else runs_sent[0]:
                print(f"    {ms:7.2f} ms  {statement}")
        print(f"{'all, in turn':<14} {total:7.1f} ms")
        gauges = Gauges(readers.values())  # as /metrics refreshes them (side by side on PostgreSQL)
        walls, cpus = [], []
        for _ in range(4 * runs):  # the first rounds prepare each statement on each pooled connection: not timed
            gauges._read_at = 0.0  # uncached
            t, c = time.perf_counter(), time.process_time()
            await gauges.refresh(ctx)
            walls.append((time.perf_counter() - t) * 1000)
            cpus.append((time.process_time() - c) * 1000)
        walls, cpus = walls[2 * runs:], cpus[2 * runs:]
        print(f"{'refresh':<14} {statistics.median(walls):7.1f} ms wall, {statistics.median(cpus):5.1f} ms CPU of this process"
              f"   (load {load()})")
    finally:
        await store.close()


# --- ab: the write path's cost of the kept counts and the list indexes ---------------------------------------

WITHOUT = [
    "DROP TRIGGER interactions_count_insert ON interactions", "DROP TRIGGER interactions_count_delete ON interactions",
    "DROP TRIGGER interactions_count_update ON interactions", "DROP INDEX ix_interactions_queued_by_id",
    "DROP INDEX ix_interactions_few_by_id",
]


async def migrated(url: str) -> None:
    from mainspring.store import Store
    from mainspring.store.migrate import migrate as migrate_store

    store = Store(url, pool_size=1)
    try:
        await migrate_store(store)
    finally:
        await store.close()


async def ab_round(url: str, with_counts: bool, creates: int, jobs: int) -> dict[str, float]:
    """On a fresh database, with the kept counts and list indexes or without: ``write_path``."""
    import asyncpg

    await fresh_database(url)
    await migrated(url)
    if not with_counts:
        conn = await asyncpg.connect(url)
        for statement in WITHOUT:
            await conn.execute(statement)
        await conn.close()
    return await write_path(url, creates, jobs)


async def write_path(url: str, creates: int, jobs: int, statements: bool = False, generic_plans: bool = True) -> dict[str, float]:
    """On the (migrated) store as it is: ``creates`` creates one at a time (p50, CPU of this process and of
    its PostgreSQL backends per create), then a worker processing ``jobs`` items of a queue of their own
    (processed/s, CPU per item). ``statements``: print what each statement of the worker's run cost
    (``pg_stat_statements``, which the server must preload; reset before the worker starts). The worker has a
    store of its own, as ``mainspring worker`` does (``generic_plans``: as it does, its plans generic)."""
    import asyncpg

    from mainspring.app import App
    from mainspring.interactions import service
    from mainspring.interactions.settings import InteractionsSettings
    from mainspring.interactions.worker import Worker
    from mainspring.store import Store

    name = url.rsplit("/", 1)[1]
    cfg = InteractionsSettings()
    store = Store(url, pool_size=4)
    await store.start()
    work = f"work-{time.time_ns()}"  # a queue of its own each run: a filled store keeps earlier runs' items
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
            await service.create_many(store, cfg, work, [{"data": {"n": i}} for i in range(start, min(jobs, start + 1000))])
        done = asyncio.Event()
        handled = 0
        app = App()

        @app.queue(work)
        async def noop(item: Any) -> None:
            nonlocal handled
            handled += 1
            if handled >= jobs:
                done.set()

        async def backends() -> dict[int, float]:
            """CPU so far of each of the store's backends (one that starts later starts from 0)."""
            conn = await asyncpg.connect(url)
            found = {r[0] for r in await conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", name)}
            await conn.close()
            return {pid: backends_cpu_s({pid}) for pid in found}

        worker_store = Store(url, pool_size=4, generic_plans=generic_plans)
        await worker_store.start()
        worker = Worker(worker_store, app, cfg, poll_ms=1000)
        if statements:
            await reset_statements(url)
        pg_before = await backends()
        began, cpu = time.perf_counter(), time.process_time()
        await worker.start()
        await asyncio.wait_for(done.wait(), 600)
        result["processed_per_s"] = jobs / (time.perf_counter() - began)
        result["worker_cpu_us"] = (time.process_time() - cpu) / jobs * 1e6
        pg_after = await backends()
        result["worker_pg_cpu_us"] = sum(t - pg_before.get(pid, 0.0) for pid, t in pg_after.items()) / jobs * 1e6
        await worker.stop()
        await worker_store.close()
        if statements:
            await print_statements(url, jobs)
        return result
    finally:
        await store.close()


async def reset_statements(url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url.rsplit("/", 1)[0] + "/postgres")
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    await conn.execute("SELECT pg_stat_statements_reset()")
    await conn.close()


async def print_statements(url: str, jobs: int, top: int = 12) -> None:
    """The costliest statements run on ``url``'s database since the reset, per processed item."""
    import asyncpg

    admin, name = url.rsplit("/", 1)
    conn = await asyncpg.connect(admin + "/postgres")
    rows = await conn.fetch(
        "SELECT calls, total_exec_time, total_plan_time, shared_blks_hit, shared_blks_read, shared_blks_dirtied, wal_records,"
        " left(regexp_replace(query, '\\s+', ' ', 'g'), 110) AS q FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
        " WHERE d.datname = $1 ORDER BY total_exec_time + total_plan_time DESC LIMIT $2", name, top)
    await conn.close()
    print("    per item: exec µs | plan µs | calls | blks hit | read | dirtied | wal recs | statement")
    for r in rows:
        print(f"    {r['total_exec_time'] / jobs * 1000:7.1f} | {r['total_plan_time'] / jobs * 1000:6.1f} | {r['calls'] / jobs:5.2f} |"
              f" {r['shared_blks_hit'] / jobs:6.1f} | {r['shared_blks_read'] / jobs:4.1f} | {r['shared_blks_dirtied'] / jobs:5.2f} |"
              f" {r['wal_records'] / jobs:5.2f} | {r['q']}")


async def ab(url: str, rounds: int, creates: int, jobs: int) -> None:
    for r in range(rounds):
        for with_counts in (True, False):
            measured = await ab_round(url, with_counts, creates, jobs)
            label = "counts+indexes" if with_counts else "without      "
            print(f"round {r} {label} " + "  ".join(f"{k} {v:.1f}" for k, v in measured.items()) + f"   (load {load()})", flush=True)


async def filled_vs_empty(filled: str, empty: str, rounds: int, creates: int, jobs: int, statements: bool = False) -> None:
    """``write_path`` on the filled store and on an empty one (made fresh and migrated here), alternating."""
    await fresh_database(empty)
    await migrated(empty)
    for r in range(rounds):
        for label, url in (("filled", filled), ("empty ", empty)):
            measured = await write_path(url, creates, jobs, statements)
            print(f"round {r} {label} " + "  ".join(f"{k} {v:.1f}" for k, v in measured.items()) + f"   (load {load()})", flush=True)


async def generic_ab(url: str, rounds: int, creates: int, jobs: int, statements: bool = False) -> None:
    """``write_path`` on one store, the worker's plans generic (as ``mainspring worker`` runs) or PostgreSQL's
    choice per statement (custom until a generic plan looks no costlier), alternating."""
    for r in range(rounds):
        for generic in (True, False):
            measured = await write_path(url, creates, jobs, statements, generic_plans=generic)
            label = "generic" if generic else "chosen "
            print(f"round {r} {label} " + "  ".join(f"{k} {v:.1f}" for k, v in measured.items()) + f"   (load {load()})", flush=True)


# --- soak: a steady create rate with processing and retention, sizes and plans sampled over time ------------

SOAK_QUEUE = "soak"
HOT_TABLES = ("interactions", "interaction_counts", "events", "interaction_queues")
SCANS_FLAGGED = ("interactions", "events")  # the big ones (a few-row table is best read by a Seq Scan)
SOAK_EXPLAINED = {
    "queue counts": "SELECT * FROM interaction_counts WHERE queue = 'soak'",
    "lease probe (ready by priority)": "SELECT id FROM interactions WHERE queue = 'soak' AND state = 'queued' "
                                       "AND next_processing <= {now} ORDER BY priority DESC, next_processing, id LIMIT 100",
    "expired leases": "SELECT id FROM interactions WHERE queue = 'soak' AND state = 'processing' "
                      "AND lease_expires_at < {now} LIMIT 100",
    "retention (finished)": "SELECT id FROM interactions WHERE queue = 'soak' AND finished_at IS NOT NULL "
                            "AND finished_at < {now} - {retention_ms} ORDER BY finished_at LIMIT 500",
    "retention (events)": "SELECT id FROM events WHERE at < {now} - {retention_ms} "
                          "AND position < (SELECT max(position) FROM events) ORDER BY at LIMIT 1000",
    "list status=failed": "SELECT * FROM interactions WHERE queue = 'soak' AND state = 'failed' ORDER BY id LIMIT 51",
    "list, first page": "SELECT * FROM interactions WHERE queue = 'soak' ORDER BY id LIMIT 51",
}


QUEUED_INDEXES = ("ix_interactions_ready", "ix_interactions_due")
"""The indexes every item enters and leaves within milliseconds (partial on queued items)."""


async def watch_horizon(url: str, stop: asyncio.Event, oldest: dict[str, Any]) -> None:
    """Every second: the oldest snapshot any backend holds (``age(backend_xmin)``, in transactions) and who
    holds it; ``oldest`` keeps the largest since the last sample took it. While a snapshot is held, no
    dead entry newer than it can be removed, so the queued-item indexes can only grow."""
    import asyncpg

    conn = await asyncpg.connect(url)
    await conn.execute("SET application_name = 'soak-horizon'")
    try:
        while not stop.is_set():
            r = await conn.fetchrow(
                "SELECT age(backend_xmin) AS age, backend_type, coalesce(datname, '') AS db, left(query, 60) AS query "
                "FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND application_name <> 'soak-horizon' "
                "ORDER BY age(backend_xmin) DESC LIMIT 1")
            if r is not None and r["age"] > oldest.get("age", -1):
                oldest.update(age=r["age"], who=f"{r['backend_type']} {r['db']}: {r['query']}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1)
    finally:
        await conn.close()


async def soak_sample(conn: Any, t: float, retention_ms: int) -> list[tuple[float, str, str, float]]:
    """One sample: (t, measure, relation or statement, value) rows."""
    rows: list[tuple[float, str, str, float]] = []
    for r in await conn.fetch(
            "SELECT relname, pg_relation_size(relid) AS size, n_live_tup, n_dead_tup, autovacuum_count, "
            "autoanalyze_count FROM pg_stat_user_tables"):
        for measure in ("size", "n_live_tup", "n_dead_tup", "autovacuum_count", "autoanalyze_count"):
            rows.append((t, f"table_{measure}", r["relname"], float(r[measure])))
    for r in await conn.fetch("SELECT indexrelname, pg_relation_size(indexrelid) AS size FROM pg_stat_user_indexes"):
        rows.append((t, "index_size", r["indexrelname"], float(r["size"])))
    for index in QUEUED_INDEXES:  # where their pages are: in use, emptied (reusable) or deleted (pgstattuple)
        r = await conn.fetchrow("SELECT leaf_pages, empty_pages, deleted_pages, avg_leaf_density FROM pgstatindex($1)", index)
        for measure in ("leaf_pages", "empty_pages", "deleted_pages", "avg_leaf_density"):
            rows.append((t, f"btree_{measure}", index, float(r[measure])))
    now = int(time.time() * 1000)
    for what, sql in SOAK_EXPLAINED.items():
        plan = "\n".join(p[0] for p in await conn.fetch(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) " + sql.format(now=now, retention_ms=retention_ms)))
        ms = float(plan.rsplit("Execution Time: ", 1)[1].split(" ")[0])
        scans = [table for table in SCANS_FLAGGED if f"Seq Scan on {table} " in plan]
        rows.append((t, "explain_ms", what, ms))
        rows.append((t, "seq_scan", what, float(bool(scans))))
        if scans:
            print(f"  SEQ SCAN at {t:.0f} s in {what!r}:\n{plan}", flush=True)
    return rows


async def soak(url: str, minutes: float, rate: int, retention_s: int, name: str = "soak", sample_s: float = 30) -> None:
    import csv

    import asyncpg

    from mainspring.app import App
    from mainspring.interactions.settings import InteractionsSettings
    from mainspring.interactions.worker import Worker
    from mainspring.store import Store

    await fresh_database(url)
    migrate(url)
    retention_ms = retention_s * 1000
    env = {"MAINSPRING_INTERACTIONS__RETENTION_MS": str(retention_ms),
           "MAINSPRING_INTERACTIONS__RETENTION_INTERVAL_MS": "10000",
           "MAINSPRING_SERVER__EVENTS_RETENTION_MS": str(retention_ms),
           "MAINSPRING_SERVER__RETENTION_INTERVAL_MS": "10000"}
    import os
    os.environ.update(env)
    out = ROOT / "bench"
    samples: list[tuple[float, str, str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        proc, base, _ = start_server(url, Path(tmp) / "data")
        store = Store(url, pool_size=4, generic_plans=True)  # as ``mainspring worker`` runs
        await store.start()
        created = handled = 0
        app = App()

        @app.queue(SOAK_QUEUE, concurrency=500, batch=500)  # worker-speed's best settings: keeps up at 500/s
        async def noop(item: Any) -> None:
            nonlocal handled
            handled += 1

        worker = Worker(store, app, InteractionsSettings(retention_ms=retention_ms), poll_ms=1000)
        stop = asyncio.Event()
        began = time.monotonic()
        per_call = max(1, rate // 10)

        async def produce(client: httpx.AsyncClient) -> None:
            nonlocal created
            tick = 0
            while not stop.is_set():
                tick += 1
                response = await client.post(f"/v1/queues/{SOAK_QUEUE}/interactions/bulk",
                                             json={"interactions": [{"data": {"n": tick}}] * per_call})
                assert response.status_code == 201, response.text[:300]
                created += per_call
                # Paced by the clock: a late call is followed at once by the next (the rate is kept on average).
                await asyncio.sleep(max(0.0, began + tick * per_call / rate - time.monotonic()))

        try:
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                await client.put(f"/v1/queues/{SOAK_QUEUE}", json={"retention_ms": retention_ms})
                await worker.start()
                producer = asyncio.create_task(produce(client))
                sampler = await asyncpg.connect(url)
                await sampler.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
                oldest: dict[str, Any] = {}
                watcher = asyncio.create_task(watch_horizon(url, stop, oldest))
                last = (0, 0, began)
                while time.monotonic() - began < minutes * 60:
                    await asyncio.sleep(sample_s - (time.monotonic() - began) % sample_s)
                    t = time.monotonic() - began
                    rows = await soak_sample(sampler, t, retention_ms)
                    rows.append((t, "horizon", "max_xmin_age", float(oldest.get("age", 0))))
                    held_by = oldest.get("who", "")
                    oldest.clear()
                    c, h, at = created, handled, time.monotonic()
                    rows += [(t, "rate", "created_per_s", (c - last[0]) / (at - last[2])),
                             (t, "rate", "processed_per_s", (h - last[1]) / (at - last[2])),
                             (t, "load", "loadavg_1m", float(load()))]
                    last = (c, h, at)
                    samples += rows
                    size = {n: v for _, m, n, v in rows if m == "table_size"}
                    dead = {n: v for _, m, n, v in rows if m == "table_n_dead_tup"}
                    print(f"{t:6.0f} s  created/s {rows[-3][3]:6.0f}  processed/s {rows[-2][3]:6.0f}  "
                          f"interactions {size.get('interactions', 0) / 2**20:7.1f} MB dead {dead.get('interactions', 0):8.0f}  "
                          f"events {size.get('events', 0) / 2**20:7.1f} MB dead {dead.get('events', 0):8.0f}  load {load()}",
                          flush=True)
                    queued = {n: v for _, m, n, v in rows if m == "index_size" and n in QUEUED_INDEXES}
                    pages = {(m, n): v for _, m, n, v in rows if m.startswith("btree_")}
                    print("         " + "  ".join(
                        f"{n} {queued.get(n, 0) / 2**20:.2f} MB (leaf {pages[('btree_leaf_pages', n)]:.0f}, empty "
                        f"{pages[('btree_empty_pages', n)]:.0f}, deleted {pages[('btree_deleted_pages', n)]:.0f}, "
                        f"density {pages[('btree_avg_leaf_density', n)]:.0f} %)" for n in QUEUED_INDEXES)
                        + f"  oldest snapshot {rows[-1][3]:.0f} xacts ({held_by})", flush=True)
                    with open(out / f"{name}.csv", "w", newline="") as f:  # noqa: ASYNC230 (a few KiB every sample, between samples)
                        writer = csv.writer(f)
                        writer.writerow(["t_s", "measure", "name", "value"])
                        writer.writerows(samples)
                stop.set()
                await producer
                await watcher
                await sampler.close()
        finally:
            await worker.stop()
            await store.close()
            proc.terminate()
            proc.wait(timeout=30)
    soak_plot(samples, retention_s, out / f"{name}.png")


def soak_plot(samples: list[tuple[float, str, str, float]], retention_s: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(measure: str, keep: Any) -> dict[str, tuple[list[float], list[float]]]:
        found: dict[str, tuple[list[float], list[float]]] = {}
        for t, m, n, v in samples:
            if m == measure and keep(n):
                xs, ys = found.setdefault(n, ([], []))
                xs.append(t / 60)
                ys.append(v)
        return found

    def hot(name: str) -> bool:
        return name.startswith(HOT_TABLES) or name.startswith(("ix_interaction", "pk_interaction", "ix_events", "pk_events", "uq_events"))

    panels = [("table_size", "table size (MiB)", 2**20, lambda n: n in HOT_TABLES),
              ("index_size", "index size (MiB)", 2**20, hot),
              ("table_n_dead_tup", "dead tuples (thousands)", 1000, lambda n: n in HOT_TABLES),
              ("rate", "per second", 1, lambda n: True)]
    if any(m == "btree_leaf_pages" for _, m, _, _ in samples):  # the queued-item indexes' pages (pgstattuple)
        panels += [("btree_leaf_pages", "queued indexes: leaf pages in use", 1, lambda n: True),
                   ("btree_deleted_pages", "queued indexes: deleted (reusable) pages", 1, lambda n: True),
                   ("table_autovacuum_count", "autovacuums so far", 1, lambda n: n in ("interactions", "events"))]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.5 * len(panels)), sharex=True)
    for ax, (measure, label, scale, keep) in zip(axes, panels, strict=True):
        for n, (xs, ys) in sorted(series(measure, keep).items()):
            if max(ys) > 0:
                ax.plot(xs, [y / scale for y in ys], label=n)
        for window in range(retention_s, int(max(t for t, *_ in samples)) + 1, retention_s):
            ax.axvline(window / 60, color="grey", linestyle=":", linewidth=0.8)
        ax.set_ylabel(label)
        ax.legend(fontsize=7, loc="upper left", ncol=2)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("minutes (dotted: each retention window)")
    fig.suptitle("Soak: steady creates, a worker completing them, retention on (bench/scale.py soak)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["fill", "fill-faces", "upgrade-cost", "measure", "measure-faces", "service", "explain", "ab",
                                            "filled-vs-empty", "generic-ab", "gauges", "soak", "soak-plot"])
    parser.add_argument("--database", required=True)
    parser.add_argument("--empty", help="filled-vs-empty: the empty store to compare with (made fresh)")
    parser.add_argument("--interactions", type=int, default=1_000_000)
    parser.add_argument("--queues", type=int, default=5)
    parser.add_argument("--faces-rows", type=int, default=1_000_000, help="fill-faces: machines, messages, tasks")
    parser.add_argument("--faces", default="machines,exchange,batching", help="fill-faces: which")
    parser.add_argument("--minutes", type=float, default=30, help="soak: how long")
    parser.add_argument("--rate", type=int, default=500, help="soak: creates per second")
    parser.add_argument("--retention-s", type=int, default=300, help="soak: retention of finished items and events")
    parser.add_argument("--soak-name", default="soak", help="soak: writes bench/<name>.csv and .png")
    parser.add_argument("--sample-s", type=float, default=30, help="soak: seconds between samples")
    parser.add_argument("--rounds", type=int, default=3, help="ab, filled-vs-empty: rounds")
    parser.add_argument("--statements", action="store_true",
                        help="filled-vs-empty: each worker run's statements (pg_stat_statements must be preloaded)")
    args = parser.parse_args()
    print(f"{args.command} {args.database} at {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {load()}")
    if args.command == "fill":
        started = time.monotonic()
        if args.database.startswith("postgresql"):
            asyncio.run(fill_postgres(args.database, args.interactions, args.queues))
        else:
            fill_sqlite(args.database, args.interactions, args.queues)
        print(f"filled in {time.monotonic() - started:.0f} s")
    elif args.command == "upgrade-cost":
        asyncio.run(upgrade_cost(args.database))
    elif args.command == "measure-faces":
        measure_faces(args.database)
    elif args.command == "measure":
        measure(args.database, "q0")
    elif args.command == "service":
        asyncio.run(service_times(args.database))
    elif args.command == "fill-faces":
        started = time.monotonic()
        asyncio.run(fill_faces(args.database, args.faces_rows, args.faces.split(",")))
        print(f"filled in {time.monotonic() - started:.0f} s")
    elif args.command == "soak-plot":  # again from the CSV a soak wrote
        import csv

        with open(ROOT / "bench" / f"{args.soak_name}.csv") as f:
            rows = [(float(r["t_s"]), r["measure"], r["name"], float(r["value"])) for r in csv.DictReader(f)]
        soak_plot(rows, args.retention_s, ROOT / "bench" / f"{args.soak_name}.png")
    elif args.command == "soak":
        asyncio.run(soak(args.database, args.minutes, args.rate, args.retention_s, args.soak_name, args.sample_s))
    elif args.command == "ab":
        asyncio.run(ab(args.database, args.rounds, 2000, 5000))
    elif args.command == "gauges":
        asyncio.run(gauge_times(args.database))
    elif args.command == "generic-ab":
        asyncio.run(generic_ab(args.database, args.rounds, 2000, 5000, args.statements))
    elif args.command == "filled-vs-empty":
        asyncio.run(filled_vs_empty(args.database, args.empty, args.rounds, 2000, 5000, args.statements))
    else:
        asyncio.run(explain(args.database))


if __name__ == "__main__":
    main()
