"""The request path, measured the way the issue measured it: the shared ``wrk`` probes against a real
``mainspring serve``, each figure also as a fraction of the same run's ``GET /healthz`` floor.

    .venv/bin/python -m bench.request_path [--engines sqlite,postgres] [--seconds 5] [--workers 1] [--pg URL]

Needs ``wrk`` (Debian package) and the probes in ``../shared/bench/http/`` (the ``*.lua`` scripts and
``counter_app.py``; this runs them the way ``run.sh`` and ``machines.sh`` do, one ``wrk`` per row, so it can
read the CPU each row cost). Prints one markdown table per engine, with per operation the server's CPU (the
``mainspring serve`` process tree's utime+stime over the requests it answered in that row) and PostgreSQL's
(the backends of the bench's database, ``pgcpu.backends_cpu_s``), and ``uptime``'s load beside it: the
machine is shared, so rates move with it while CPU per operation mostly does not.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench.pgcpu import backends_cpu_s

# Beside the repository (../shared/bench/http); a worktree elsewhere names the folder in BENCH_HTTP_PROBES.
PROBES = Path(os.environ.get("BENCH_HTTP_PROBES") or Path(__file__).resolve().parents[2] / "shared" / "bench" / "http")
UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}
LATENCY = re.compile(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)
REQUESTS = re.compile(r"^\s+(\d+) requests in", re.M)
NON2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")
MACHINES = 1000
IDLE_S = 3.0
NAMES = {
    "healthz": "`GET /healthz` (the floor)",
    "ia_create": "create an interaction",
    "ex_put": "put a 200-byte exchange message",
    "bt_submit": "submit a batching task (group_size 1)",
    "mc_start": "machine Start (in-process processor)",
    "mc_call": "machine Call (in-process processor)",
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fresh_pg(admin: str) -> str:
    name = f"msbench_http_{os.getpid()}"
    for sql in (f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"'):
        subprocess.run(["psql", admin, "-q", "-c", sql], check=True, capture_output=True)
    return admin.rsplit("/", 1)[0] + "/" + name


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"server exited:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("server not ready")


@dataclass
class Row:
    name: str
    conns: int
    rps: float
    p50_ms: float
    p99_ms: float
    non2xx: int
    requests: int
    server_cpu_ms: float
    """The server process tree's CPU per request answered (ms)."""
    server_net_ms: float
    """The same less what the server spends idle over as long (its background loops; measured before the rows)."""
    pg_cpu_ms: float | None
    """The bench database's PostgreSQL backends' CPU per request (ms); None on SQLite."""


def tree_cpu_s(root: int) -> float:
    """utime+stime of ``root`` and every process under it (a server's ``--workers`` children), in seconds."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parts = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(stat.parent.name)
        parents[pid], ticks[pid] = int(parts[1]), int(parts[11]) + int(parts[12])
    total, wanted = 0, {root}
    while wanted:
        pid = wanted.pop()
        total += ticks.get(pid, 0)
        wanted |= {child for child, parent in parents.items() if parent == pid}
    return total / os.sysconf("SC_CLK_TCK")


def backend_pids(admin: str, database: str) -> set[int]:
    name = database.rsplit("/", 1)[1]
    out = subprocess.run(["psql", admin, "-Atc", f"SELECT pid FROM pg_stat_activity WHERE datname = '{name}'"],
                         capture_output=True, text=True, check=True).stdout
    return {int(line) for line in out.split()}


def backends_by_pid(pids: set[int]) -> dict[int, float]:
    return {pid: backends_cpu_s({pid}) for pid in pids}


def curl(method: str, url: str, body: str) -> None:
    request = urllib.request.Request(url, data=body.encode(), method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30):
        pass


def wrk(url: str, script: str | None, conns: int, seconds: int, env: dict[str, str]) -> tuple[float, float, float, int, int]:
    """One ``wrk -t1`` row: rps, p50 and p99 (ms), non-2xx and requests answered."""
    args = ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--latency"]
    if script is not None:
        args += ["-s", str(PROBES / script)]
    out = subprocess.run([*args, url], capture_output=True, text=True, check=True, env={**os.environ, **env}).stdout
    latency = {q: float(v) * UNIT_MS[u] for q, v, u in LATENCY.findall(out)}
    requests = int(REQUESTS.search(out).group(1))  # type: ignore[union-attr]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    non2xx = NON2XX.search(out)
    return rps, latency["50"], latency["99"], int(non2xx.group(1)) if non2xx else 0, requests


def probe(engine: str, seconds: int, workers: int, pg_admin: str, tmp: Path) -> list[Row]:
    database = f"sqlite:///{tmp / engine / 'mainspring.db'}" if engine == "sqlite" else fresh_pg(pg_admin)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / f"serve-{engine}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(PROBES), os.environ.get("PYTHONPATH", "")) if p),
           "MAINSPRING_SERVER__LOG_LEVEL": "WARNING"}
    command = [sys.executable, "-m", "mainspring.cli", "serve", "--port", str(port), "--database", database,
               "--data-dir", str(tmp / engine), "--app", "counter_app:app"]
    if workers > 1:
        command += ["--workers", str(workers)]
    proc = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    rows: list[Row] = []
    try:
        wait_ready(url, proc, log)
        tag = str(int(time.time()))
        names = {"QUEUE": "wrk" + tag, "MAILBOX": "wrk" + tag, "BATCHER": "wrk" + tag, "MACHINES": str(MACHINES)}
        curl("PUT", f"{url}/v1/batchers/wrk{tag}",
             '{"min_size": 2, "max_size": 6, "linger_ms": 100, "max_wait_ms": 30000, "group_size": 1}')
        curl("PUT", f"{url}/v1/namespaces/counters", "{}")
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: curl("POST", f"{url}/v1/namespaces/counters/machines", f'{{"id": "m{i}", "args": null}}'),
                          range(1, MACHINES + 1)))
        # What the server spends with no request at all (its background loops), so a row's figure can be
        # read net of it: at a few dozen requests a second it is most of the gross figure.
        time.sleep(2)
        idle_pids = backend_pids(pg_admin, database) if engine == "postgres" else set()
        idle_before, pg_idle_before, idle_started = tree_cpu_s(proc.pid), backends_cpu_s(idle_pids), time.monotonic()
        time.sleep(IDLE_S)
        idle_s = time.monotonic() - idle_started
        idle_rate = (tree_cpu_s(proc.pid) - idle_before) / idle_s
        pg_idle_rate = (backends_cpu_s(idle_pids) - pg_idle_before) / idle_s
        plan = [(c, name) for c in (1, 8) for name in ("healthz", "ia_create", "ex_put", "bt_submit")]
        plan += [(c, name) for c in (1, 8) for name in ("mc_start", "mc_call")]
        for conns, name in plan:
            target = url + "/healthz" if name == "healthz" else url
            pids = backend_pids(pg_admin, database) if engine == "postgres" else set()
            server_before, pg_before, started = tree_cpu_s(proc.pid), backends_by_pid(pids), time.monotonic()
            rps, p50, p99, non2xx, requests = wrk(target, None if name == "healthz" else name + ".lua", conns, seconds, names)
            server_cpu, elapsed = tree_cpu_s(proc.pid) - server_before, time.monotonic() - started
            pg_cpu = None
            if engine == "postgres":
                after = backends_by_pid(pids | backend_pids(pg_admin, database))
                pg_cpu = sum(cpu - pg_before.get(pid, 0.0) for pid, cpu in after.items() if cpu)
            rows.append(Row(name, conns, rps, p50, p99, non2xx, requests, server_cpu * 1000 / max(requests, 1),
                            max(0.0, server_cpu - idle_rate * elapsed) * 1000 / max(requests, 1),
                            None if pg_cpu is None else pg_cpu * 1000 / max(requests, 1)))
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
    print(f"({engine}: idle, the server used {idle_rate * 1000:.0f} ms of CPU per second, PostgreSQL's backends "
          f"{pg_idle_rate * 1000:.0f} ms)", flush=True)
    return rows


def table(engine: str, rows: list[Row]) -> str:
    floor = {r.conns: r.rps for r in rows if r.name == "healthz"}
    load = Path("/proc/loadavg").read_text().split()[:3]
    lines = [f"**{engine}** (load average after: {' '.join(load)})", "",
             "| path | 1 conn: p50 · rps (of floor) | 8 conns: rps (of floor) · p99 | server CPU/op 1 · 8 conns (net of idle) | PostgreSQL CPU/op 1 · 8 conns | non-2xx |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name in NAMES:
        one = next((r for r in rows if r.name == name and r.conns == 1), None)
        eight = next((r for r in rows if r.name == name and r.conns == 8), None)
        if one is None or eight is None:
            continue
        pg = "—" if one.pg_cpu_ms is None or eight.pg_cpu_ms is None else f"{one.pg_cpu_ms:.3f} · {eight.pg_cpu_ms:.3f} ms"
        lines.append(
            f"| {NAMES[name]} | {one.p50_ms:.2f} ms · {one.rps:,.0f}/s ({one.rps / floor[1]:.2f}) "
            f"| {eight.rps:,.0f}/s ({eight.rps / floor[8]:.2f}) · {eight.p99_ms:.1f} ms "
            f"| {one.server_cpu_ms:.3f} · {eight.server_cpu_ms:.3f} ms ({one.server_net_ms:.3f} · {eight.server_net_ms:.3f}) "
            f"| {pg} | {one.non2xx + eight.non2xx} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian package wrk)")
    tmp = Path(tempfile.mkdtemp(prefix="msbench-http-"))
    try:
        for engine in [e for e in args.engines.split(",") if e]:
            if engine == "sqlite" and args.workers > 1:
                continue
            print(table(engine + (f", --workers {args.workers}" if args.workers > 1 else ""), probe(engine, args.seconds, args.workers, args.pg, tmp)), flush=True)
            print()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
