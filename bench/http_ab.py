"""The HTTP request path of two versions of the code, same run, alternated: one ``mainspring serve`` per version
(each on its own PostgreSQL database), both up for the whole run, and the ``wrk`` probes of
``../shared/bench/http/`` driven at one server then the other, round after round. Run by hand:

    git archive <commit> src | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    .venv/bin/python -m bench.http_ab --before-src /tmp/before/src [--rounds 3] [--seconds 5] [--conns 8]

Prints per round and path each version's rps and server CPU per request (the server process's utime+stime over
the requests it answered), then per path the median ratio after/before of both: on a shared machine the rates
move with the neighbours' load, the ratio of two servers measured a few seconds apart much less, and CPU per
request least.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.request_path import PROBES, curl, free_port, tree_cpu_s, wait_ready, wrk

PATHS = {"healthz": None, "ia_create": "ia_create.lua", "bt_submit": "bt_submit.lua"}


def serve(label: str, src: str | None, pg_admin: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    name = f"msbench_http_ab_{os.getpid()}_{label}"
    for sql in (f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"'):
        subprocess.run(["psql", pg_admin, "-q", "-c", sql], check=True, capture_output=True)
    database = pg_admin.rsplit("/", 1)[0] + "/" + name
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / f"serve-{label}.log"
    env = {**os.environ, "MAINSPRING_SERVER__LOG_LEVEL": "WARNING", **({"PYTHONPATH": src} if src else {})}
    proc = subprocess.Popen([sys.executable, "-m", "mainspring.cli", "serve", "--port", str(port), "--database", database,
                             "--data-dir", str(tmp / label)], env=env, cwd="/tmp", stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    wait_ready(url, proc, log)
    return proc, url, database


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before-src", required=True, help="the src/ folder of the code before")
    parser.add_argument("--after-src", default=None, help="the src/ folder of the code after (default: this checkout)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--conns", type=int, default=8)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian package wrk)")
    if not PROBES.is_dir():
        raise SystemExit(f"the wrk probes are not at {PROBES}")
    tmp = Path(tempfile.mkdtemp(prefix="msbench-http-ab-"))
    servers: dict[str, tuple[subprocess.Popen[bytes], str, str]] = {}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for label, src in (("before", args.before_src), ("after", args.after_src)):
            servers[label] = serve(label, src, args.pg, tmp)
        tag = "wrk" + str(int(time.time()))
        names = {"QUEUE": tag, "MAILBOX": tag, "BATCHER": tag}
        for _, url, _ in servers.values():
            curl("PUT", f"{url}/v1/batchers/{tag}",
                 '{"min_size": 2, "max_size": 6, "linger_ms": 100, "max_wait_ms": 30000, "group_size": 1}')
        for r in range(args.rounds):
            for path in args.paths.split(","):
                # Alternate which version goes first, so a trend in the neighbours' load favours neither.
                order = ("before", "after") if r % 2 == 0 else ("after", "before")
                line = []
                for label in order:
                    proc, url, _ = servers[label]
                    target = url + "/healthz" if PATHS[path] is None else url
                    cpu_before = tree_cpu_s(proc.pid)
                    rps, _, _, non2xx, requests = wrk(target, PATHS[path], args.conns, args.seconds, names)
                    cpu_us = (tree_cpu_s(proc.pid) - cpu_before) * 1e6 / max(requests, 1)
                    results.setdefault((path, label), []).append((rps, cpu_us))
                    line.append(f"{label} {rps:8,.0f}/s {cpu_us:5.0f} µs/req" + (f" ({non2xx} non-2xx)" if non2xx else ""))
                print(f"round {r} {path:10} " + " · ".join(line), flush=True)
        print(f"\nload average: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
        print("| path | rps before · after | ratio rps (median of rounds) | server CPU/request before · after |")
        print("| --- | --- | --- | --- |")
        for path in args.paths.split(","):
            before, after = results[(path, "before")], results[(path, "after")]
            ratios = [a[0] / b[0] for a, b in zip(after, before, strict=True)]
            print(f"| {path} | {statistics.median(b[0] for b in before):,.0f} · {statistics.median(a[0] for a in after):,.0f} "
                  f"| ×{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) "
                  f"| {statistics.median(b[1] for b in before):.0f} · {statistics.median(a[1] for a in after):.0f} µs |")
    finally:
        for proc, _, database in servers.values():
            os.killpg(proc.pid, 15)
            proc.wait(30)
            name = database.rsplit("/", 1)[1]
            subprocess.run(["psql", args.pg, "-q", "-c", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
