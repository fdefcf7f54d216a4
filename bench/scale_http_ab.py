"""Issue 26: ``GET /metrics`` (uncached) and the overview over HTTP, the code before a change against this
checkout, alternating, on one filled store (``bench/scale.py fill``, ``fill-faces``). Run by hand:

    git archive <commit> src | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    .venv/bin/python -m bench.scale_http_ab --database postgresql://postgres@127.0.0.1:5499/ms_scale --before-src /tmp/before/src

Each round starts ``mainspring serve`` on the store with each code (PYTHONPATH first), then times
``/healthz`` (the floor), ``/metrics`` and ``/ui/`` as ``scale.py measure`` does (median of 5 after one).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import httpx

from bench import scale


def serve(database: str, src: str | None) -> tuple[subprocess.Popen[bytes], str]:
    env = dict(os.environ, **({"PYTHONPATH": src} if src else {}))
    port = scale.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mainspring.cli", "serve", "--port", str(port), "--database", database,
                             "--data-dir", tempfile.mkdtemp()], cwd="/tmp", stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    base = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit("server exited")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", required=True)
    parser.add_argument("--before-src", required=True, help="the src/ folder of the code before")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for r in range(args.rounds):
        for label, src in (("before", args.before_src), ("after ", None)):
            proc, base = serve(args.database, src)
            try:
                with httpx.Client(base_url=base, timeout=60) as client:
                    timed = [f"{path} {scale.timed(client, path)[0]:6.1f}" for path in ("/healthz", "/metrics", "/ui/")]
                print(f"round {r} {label} " + "  ".join(timed) + f"  ms (load {scale.load()})", flush=True)
            finally:
                proc.terminate()
                proc.wait(30)


if __name__ == "__main__":
    main()
