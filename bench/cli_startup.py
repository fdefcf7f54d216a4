"""How long a ``mainspring`` command takes to start and finish, wall clock, two source trees alternated.

    .venv/bin/python -m bench.cli_startup [--runs 7] [--before /work/main/src] [--after src]

Runs each command with ``PYTHONPATH`` set to one tree, then the other (A, B, A, B…), so both see the same
load; prints the median and the spread per command and tree. The commands: ``mainspring --version``, and
``mainspring interactions list QUEUE`` against a ``mainspring serve`` started for the run (SQLite in a
temporary folder; the queue is empty, so the answer is one short request).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(tree: str, args: list[str]) -> float:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MAINSPRING_")}, "PYTHONPATH": tree}
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mainspring.cli", *args], env=env, capture_output=True, check=False)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--before", default="/work/main/src")
    parser.add_argument("--after", default=str(Path(__file__).resolve().parents[1] / "src"))
    args = parser.parse_args()
    port = free_port()
    data = tempfile.mkdtemp(prefix="msbench-cli-")
    server = subprocess.Popen([sys.executable, "-m", "mainspring.cli", "serve", "--port", str(port), "--data-dir", data],
                              env={**os.environ, "PYTHONPATH": args.after}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        commands = {"--version": ["--version"],
                    "interactions list": ["interactions", "list", "emails", "--url", f"http://127.0.0.1:{port}"]}
        trees = {"before": args.before, "after": args.after}
        seconds: dict[tuple[str, str], list[float]] = {(c, t): [] for c in commands for t in trees}
        for _ in range(args.runs):
            for command, argv in commands.items():
                for name, tree in trees.items():
                    seconds[command, name].append(timed(tree, argv))
    finally:
        server.terminate()
        server.wait(30)
    for (command, name), taken in seconds.items():
        print(f"{command:18} {name:6} median {statistics.median(taken):.2f} s  (min {min(taken):.2f}, max {max(taken):.2f}, {len(taken)} runs)")
    print("load average:", " ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
