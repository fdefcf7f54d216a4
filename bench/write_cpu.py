"""Server CPU per write (issue 23's "server CPU per operation"): a real ``mainspring serve``, one ``wrk`` probe
at a time from ``../shared/bench/http/`` (8 connections), and the server process's utime+stime over the
requests it answered. ``GET /healthz`` and an interaction create run in the same minute as the peers to read
the exchange put and the batching submit against.

    .venv/bin/python -m bench.write_cpu [--engines postgres,sqlite] [--seconds 5] [--paths healthz,ia_create,ex_put,bt_submit]

Prints the machine's load average with every row: on a shared machine read the CPU per operation and the
ratios, not the rates.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.request_path import PROBES, free_port, fresh_pg, wait_ready

RPS = re.compile(r"Requests/sec:\s+([\d.]+)")
TOTAL = re.compile(r"(\d+) requests in")
NON2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def run(engine: str, paths: list[str], seconds: int, connections: int, pg_admin: str, tmp: Path) -> None:
    database = f"sqlite:///{tmp / engine / 'mainspring.db'}" if engine == "sqlite" else fresh_pg(pg_admin)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / f"serve-{engine}.log"
    env = {**os.environ, "MAINSPRING_SERVER__LOG_LEVEL": "WARNING"}
    command = [sys.executable, "-m", "mainspring.cli", "serve", "--port", str(port), "--database", database,
               "--data-dir", str(tmp / engine)]
    proc = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    tag = f"cpu{os.getpid()}"
    try:
        wait_ready(url, proc, log)
        subprocess.run(["curl", "-s", "-X", "PUT", f"{url}/v1/batchers/{tag}", "-H", "Content-Type: application/json",
                        "-d", '{"min_size": 2, "max_size": 6, "linger_ms": 100, "max_wait_ms": 30000, "group_size": 1}'],
                       check=True, capture_output=True)
        for path in paths:
            args = [f"{url}/healthz"] if path == "healthz" else ["-s", str(PROBES / f"{path}.lua"), url]
            before = cpu_seconds(proc.pid)
            out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", *args], capture_output=True,
                                 text=True, check=True, env={**os.environ, "QUEUE": tag, "MAILBOX": tag, "BATCHER": tag}).stdout
            after = cpu_seconds(proc.pid)
            user, system = after[0] - before[0], after[1] - before[1]
            total = int(TOTAL.search(out).group(1))  # type: ignore[union-attr]
            rps = float(RPS.search(out).group(1))  # type: ignore[union-attr]
            bad = NON2XX.search(out)
            print(f"{engine:8} {path:10} c={connections} rps={rps:8.0f} server CPU/op={(user + system) / max(total, 1) * 1000:.3f} ms "
                  f"(user {user / max(total, 1) * 1000:.3f}, system {system / max(total, 1) * 1000:.3f}) "
                  f"non2xx={bad.group(1) if bad else 0} load={os.getloadavg()[0]:.1f}", flush=True)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default="postgres,sqlite")
    parser.add_argument("--paths", default="healthz,ia_create,ex_put,bt_submit")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian package wrk)")
    tmp = Path(tempfile.mkdtemp(prefix="msbench-cpu-"))
    try:
        for engine in [e for e in args.engines.split(",") if e]:
            run(engine, [p for p in args.paths.split(",") if p], args.seconds, args.connections, args.pg, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
