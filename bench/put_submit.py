"""An exchange put and a batching submit through the library, no HTTP and no background loops: this
process's CPU per operation (utime+stime) and the statements (round trips on PostgreSQL) per operation, one
caller at a time or ``--concurrency`` at once (sharing group commits). Compare versions of the code in the
same minute with ``PYTHONPATH=<a git archive of the other version>/src``.

    .venv/bin/python -m bench.put_submit --engine postgres --operations 600 --concurrency 1
    .venv/bin/python -m bench.put_submit --engine sqlite --operations 600 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

from bench.exchange import drop_database, fresh_database
from mainspring.batching import service
from mainspring.batching.models import BatcherSettingsIn, TaskIn
from mainspring.core.runtime import Context
from mainspring.exchange import messages
from mainspring.exchange.settings import ExchangeSettings
from mainspring.store import Store
from mainspring.store.migrate import migrate


async def run(engine: str, operations: int, concurrency: int, only: list[str]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-put-submit-"))
    url = await fresh_database(engine, workdir)
    store = Store(url, pool_size=10)
    try:
        await migrate(store)
        settings = SimpleNamespace(server=SimpleNamespace(data_dir=workdir / "data", poll_interval_ms=1000),
                                   exchange=ExchangeSettings())
        ctx = Context(settings=settings, store=store)  # type: ignore[arg-type]
        # A batcher that never packs during the run: the submit alone is measured.
        await service.put_batcher(store, "b", BatcherSettingsIn.model_validate(
            {"group_size": 1, "min_size": 100_000, "max_size": 100_000, "linger_ms": 3_600_000, "max_wait_ms": 3_600_000}))

        async def put(i: int) -> None:
            await messages.store_message(ctx, "a", "d", b"x" * 200, content_type=None, message_key=None, sender=None)

        async def submit(i: int) -> None:
            await service.submit_task(store, "b", TaskIn(id=f"t{i}", group=f"g{i}", member="en", content=f"text {i}"))

        paths: dict[str, Callable[[int], Awaitable[None]]] = {"put": put, "submit": submit}
        for name in only:
            write = paths[name]
            for i in range(20):  # warm: connections, prepared statements
                await write(-i - 1)
            cpu, began, trips = sum(os.times()[:2]), time.monotonic(), store.backend.round_trips

            async def lane(first: int, write: Callable[[int], Awaitable[None]] = write) -> None:
                for i in range(first, operations, concurrency):
                    await write(i)

            await asyncio.gather(*(lane(k) for k in range(concurrency)))
            cpu, elapsed = sum(os.times()[:2]) - cpu, time.monotonic() - began
            print(f"{engine:8} {name:6} concurrency={concurrency} {operations / elapsed:7.0f}/s "
                  f"library CPU/op {cpu / operations * 1000:.3f} ms "
                  f"round trips/op {(store.backend.round_trips - trips) / operations:.2f} "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        await store.close()
        await drop_database(url)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["sqlite", "postgres"], default="postgres")
    parser.add_argument("--operations", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--only", default="put,submit")
    args = parser.parse_args()
    asyncio.run(run(args.engine, args.operations, args.concurrency, args.only.split(",")))


if __name__ == "__main__":
    main()
