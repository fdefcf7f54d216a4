"""The request path, measured the way the issue measured it: the shared ``wrk`` probes against a real
``mainspring serve``, each figure also as a fraction of the same run's ``GET /healthz`` floor.

    .venv/bin/python bench/request_path.py [--engines sqlite,postgres] [--seconds 5] [--workers 1] [--pg URL]

Needs ``wrk`` (Debian package) and the probes in ``../shared/bench/http/`` (``run.sh``, ``machines.sh``,
``counter_app.py``). Prints one markdown table per engine.
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
from pathlib import Path

PROBES = Path(__file__).resolve().parents[2] / "shared" / "bench" / "http"
LINE = re.compile(r"(\w+) c=(\d+) rps=([\d.]+) p50=([\d.]+)(us|ms|s) p99=([\d.]+)(us|ms|s) non2xx=(\d+)")
UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}
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


def probe(engine: str, seconds: int, workers: int, pg_admin: str, tmp: Path) -> list[tuple[str, int, float, float, float, int]]:
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
    try:
        wait_ready(url, proc, log)
        out = subprocess.run(["bash", str(PROBES / "run.sh"), url, str(seconds)], capture_output=True, text=True, check=True).stdout
        out += subprocess.run(["bash", str(PROBES / "machines.sh"), url, str(seconds)], capture_output=True, text=True, check=True).stdout
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
    rows = []
    for match in LINE.finditer(out):
        name, conns, rps, p50, p50u, p99, p99u, non2xx = match.groups()
        rows.append((name, int(conns), float(rps), float(p50) * UNIT_MS[p50u], float(p99) * UNIT_MS[p99u], int(non2xx)))
    return rows


def table(engine: str, rows: list[tuple[str, int, float, float, float, int]]) -> str:
    floor = {c: rps for name, c, rps, *_ in rows if name == "healthz"}
    lines = [f"**{engine}**", "", "| path | 1 conn: p50 · rps (of floor) | 8 conns: rps (of floor) · p99 | non-2xx |", "| --- | --- | --- | --- |"]
    for name in NAMES:
        one = next((r for r in rows if r[0] == name and r[1] == 1), None)
        eight = next((r for r in rows if r[0] == name and r[1] == 8), None)
        if one is None or eight is None:
            continue
        lines.append(
            f"| {NAMES[name]} | {one[3]:.2f} ms · {one[2]:,.0f}/s ({one[2] / floor[1]:.2f}) "
            f"| {eight[2]:,.0f}/s ({eight[2] / floor[8]:.2f}) · {eight[4]:.1f} ms | {one[5] + eight[5]} |"
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
