"""The framework's own floor for a write: a FastAPI route that validates a JSON body into a model and answers
201 with a JSON body, doing nothing else — what any create costs before Mainspring does anything.

    .venv/bin/python -m bench.framework_floor [--seconds 5]

Starts this app under uvicorn (uvloop, httptools, as ``mainspring serve``), runs ``wrk`` with the shared
create probe (``../shared/bench/http/ia_create.lua``) from 1 and 8 connections, and prints
``floor c= rps= p50=`` lines to set beside ``bench/request_path.py``'s create row.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from bench import ROOT

PROBES = Path(__file__).resolve().parents[2] / "shared" / "bench" / "http"

app = FastAPI()


class CreateIn(BaseModel):
    data: dict[str, Any] | None = None


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/v1/queues/{queue}/interactions", status_code=201)
async def create(queue: str, body: CreateIn) -> dict[str, Any]:
    return {"id": "1", "queue": queue, "status": "ready", "data": body.data}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--port", type=int, default=18990)
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bench.framework_floor:app", "--port", str(args.port), "--log-level", "warning",
         "--no-access-log"], env=env,
    )
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        for conns in (1, 8):
            out = subprocess.run(
                ["wrk", "-t1", f"-c{conns}", f"-d{args.seconds}s", "--latency", "-s", str(PROBES / "ia_create.lua"), url],
                capture_output=True, text=True, check=True,
            ).stdout
            rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
            p50 = re.search(r" 50%\s+(\S+)", out)
            print(f"floor c={conns} rps={rps.group(1) if rps else '?'} p50={p50.group(1) if p50 else '?'}", flush=True)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
