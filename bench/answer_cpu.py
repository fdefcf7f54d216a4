"""CPU per request of the hottest answers — create an interaction, lease 1, lease 50 — in process (no ``wrk``
needed; SQLite in a temporary directory), for a before/after of the request path's answer encoding.

    .venv/bin/python -m bench.answer_cpu [--rounds 5] [--requests 100]

Prints per operation the process CPU (user+sys) per request, median of the rounds. Compare two commits by
running it alternately from each (``PYTHONPATH=<other checkout>/src``) on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from mainspring.api import create_app
from mainspring.config import load_settings
from mainspring.store import Store
from mainspring.store.migrate import migrate


async def main(rounds: int, requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(None, server={"database": f"sqlite:///{Path(tmp) / 'm.db'}", "data_dir": Path(tmp) / "data"})
        store = Store(settings.server.database_url())
        await store.start()
        await migrate(store)
        app = create_app(settings, store=store)
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://bench") as client:
            rows: dict[str, list[float]] = {}

            async def create() -> None:
                answer = await client.post("/v1/queues/bench/interactions", json={"data": {"n": 1, "text": "x" * 100}})
                assert answer.status_code == 201, answer.text

            def lease(n: int) -> Callable[[], Awaitable[None]]:
                async def run() -> None:
                    answer = await client.post("/v1/queues/bench/lease", json={"worker": "w", "max": n, "lease_ms": 3_600_000})
                    assert answer.status_code == 200 and len(answer.json()["interactions"]) == n, answer.text
                return run

            for _ in range(rounds):
                for name, run in (("create", create), ("lease 1", lease(1)), ("lease 50", lease(50))):
                    # Each lease finds its 50 (or 1) due items: the queue is filled beforehand, off the clock.
                    filled = await client.post("/v1/queues/bench/interactions/bulk", json={
                        "interactions": [{"data": {"n": i, "text": "x" * 100}} for i in range(requests * 50)]})
                    assert filled.status_code == 201, filled.text
                    started = time.process_time()
                    for _ in range(requests):
                        await run()
                    rows.setdefault(name, []).append((time.process_time() - started) / requests * 1e6)
    print(f"load {os.getloadavg()[0]:.1f}; µs CPU per request, median of {rounds} rounds of {requests}: " +
          ", ".join(f"{name} {sorted(v)[rounds // 2]:.0f}" for name, v in rows.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.requests))
