"""Exchange benchmarks.

cycles:   full protocol cycles per second against a real ``mainspring serve`` over HTTP — each cycle stores 10
          messages, starts a process on them, readies it and commits it — with one concurrent worker per
          mailbox across N mailboxes.
recovery: start-up recovery time with N processes in the store (the same ``recover`` the server runs).

    .venv/bin/python -m bench.exchange cycles --engine sqlite --mailboxes 100 --seconds 20
    .venv/bin/python -m bench.exchange cycles --engine postgres --mailboxes 100 --seconds 20
    .venv/bin/python -m bench.exchange recovery --engine sqlite --processes 100000
    .venv/bin/python -m bench.exchange recovery --engine postgres --processes 100000
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import aiohttp  # noqa: F401 - the client's transport, imported before the clock starts (the client imports it at its first call)
import asyncpg
import httpx

from mainspring.client import AsyncExchangeClient
from mainspring.core.runtime import Context
from mainspring.exchange import files
from mainspring.exchange.settings import ExchangeSettings
from mainspring.exchange.tables import exchange_messages, exchange_processes
from mainspring.exchange.watchdog import recover
from mainspring.store import Store
from mainspring.store.migrate import migrate

PG_ADMIN = os.environ.get("MAINSPRING_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


async def fresh_database(engine: str, workdir: Path) -> str:
    if engine == "sqlite":
        return f"sqlite:///{workdir / 'mainspring.db'}"
    name = f"bench_exchange_{os.getpid()}"
    conn = await asyncpg.connect(PG_ADMIN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name


async def drop_database(url: str) -> None:
    if url.startswith("postgresql"):
        conn = await asyncpg.connect(PG_ADMIN)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
        finally:
            await conn.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux): what a cycle costs the server, whatever else
    shares the machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def worker(url: str, mailbox: int, stop_at: float, counts: list[int], timings: dict[str, list[float]], library: bool = True) -> None:
    # One connection per worker, never idle in a shared pool (where the server's keep-alive timeout would
    # close it under the next request).
    if library:
        async with AsyncExchangeClient(url, timeout=300) as exchange:
            await library_cycles_of(exchange, mailbox, stop_at, counts, timings)
        return
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        await cycles_of(client, mailbox, stop_at, counts, timings)


async def library_cycles_of(
    exchange: AsyncExchangeClient, mailbox: int, stop_at: float, counts: list[int], timings: dict[str, list[float]]
) -> None:
    """The same cycle as ``cycles_of``, through the Python client (``mainspring.client.AsyncExchangeClient``)."""
    addressee = f"mobile-{mailbox}"
    while time.monotonic() < stop_at:
        began = time.perf_counter()
        ids = [(await exchange.store(addressee, "erp", b"x" * 512 + str(i).encode()))["id"] for i in range(10)]
        stored = time.perf_counter()
        process = await exchange.start(addressee, "erp", f"g{mailbox}", ids)
        await exchange.ready(process["id"])
        done = await exchange.committed(process["id"])
        assert done["state"] in ("CLEANUP", "DONE")
        counts[0] += 1
        timings["puts"].append(stored - began)
        timings["protocol"].append(time.perf_counter() - stored)


async def cycles_of(
    client: httpx.AsyncClient, mailbox: int, stop_at: float, counts: list[int], timings: dict[str, list[float]]
) -> None:
    base = f"/v1/exchange/mailboxes/mobile-{mailbox}/erp"
    while time.monotonic() < stop_at:
        began = time.perf_counter()
        ids = []
        for i in range(10):
            response = await client.post(f"{base}/messages", content=b"x" * 512 + str(i).encode())
            response.raise_for_status()
            ids.append(response.json()["id"])
        stored = time.perf_counter()
        started = await client.post(f"{base}/processes", json={"client_id": f"g{mailbox}", "message_ids": ids})
        started.raise_for_status()
        pid = started.json()["id"]
        (await client.post(f"/v1/exchange/processes/{pid}/ready")).raise_for_status()
        done = await client.post(f"/v1/exchange/processes/{pid}/committed")
        done.raise_for_status()
        # DONE once its files are deleted; CLEANUP when the disk refused a delete (retried in the background).
        assert done.json()["state"] in ("CLEANUP", "DONE")
        counts[0] += 1
        timings["puts"].append(stored - began)
        timings["protocol"].append(time.perf_counter() - stored)


async def bench_cycles(engine: str, mailboxes: int, seconds: float, library: bool = True) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-exchange-"))
    url = await fresh_database(engine, workdir)
    port = free_port()
    log = (workdir / "server.log").open("wb")
    env = {**os.environ, "MAINSPRING_SERVER__LOG_LEVEL": "WARNING", "MAINSPRING_SERVER__POOL_SIZE": "20"}
    server = subprocess.Popen(  # noqa: ASYNC220 - starting it does not block; it runs beside the loop
        [sys.executable, "-m", "mainspring.cli", "serve", "--port", str(port), "--database", url,
         "--data-dir", str(workdir / "data")], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            for _ in range(300):
                try:
                    if (await client.get("/readyz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
            counts = [0]
            timings: dict[str, list[float]] = {"puts": [], "protocol": []}
            server_cpu, own_cpu = cpu_seconds(server.pid), sum(os.times()[:2])
            started = time.monotonic()
            await asyncio.gather(*[worker(base, m, started + seconds, counts, timings, library) for m in range(mailboxes)])
            elapsed = time.monotonic() - started
            server_cpu, own_cpu = cpu_seconds(server.pid) - server_cpu, sum(os.times()[:2]) - own_cpu
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        p50 = {k: sorted(v)[len(v) // 2] * 1000 if v else 0.0 for k, v in timings.items()}
        per_cycle = 1000 / max(counts[0], 1)
        print(f"cycles engine={engine} mailboxes={mailboxes} seconds={elapsed:.1f} cycles={counts[0]} "
              f"cycles/s={counts[0] / elapsed:.1f} messages/s={10 * counts[0] / elapsed:.1f} "
              f"p50: 10 puts {p50['puts']:.1f} ms, start+ready+commit {p50['protocol']:.1f} ms; "
              f"CPU per cycle: server {server_cpu * per_cycle:.1f} ms, this client ({'library' if library else 'httpx'}) {own_cpu * per_cycle:.1f} ms",
              flush=True)
    finally:
        server.terminate()
        server.wait(30)
        await drop_database(url)
        shutil.rmtree(workdir, ignore_errors=True)


STATES = ["DONE", "CANCELLED", "CLEANUP", "READY_TO_COMMIT", "STARTED"]


def plan(processes: int, mix: str) -> list[str]:
    if mix == "inflight":
        weights = {"DONE": 0, "CANCELLED": 1, "CLEANUP": 1, "READY_TO_COMMIT": 1, "STARTED": 1}
    else:
        weights = {"DONE": 36, "CANCELLED": 1, "CLEANUP": 1, "READY_TO_COMMIT": 1, "STARTED": 1}
    cycle = [s for s, w in weights.items() for _ in range(w)]
    return [cycle[i % len(cycle)] for i in range(processes)]


async def bench_recovery(engine: str, processes: int, mix: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    url = await fresh_database(engine, workdir)
    store = Store(url, pool_size=5)
    try:
        await migrate(store)
        disk = files.Disk(workdir / "data" / "exchange")
        states = plan(processes, mix)
        await populate(store, disk, states, store.now_ms())
        settings = SimpleNamespace(server=SimpleNamespace(data_dir=workdir / "data", poll_interval_ms=1000),
                                   exchange=ExchangeSettings())
        ctx = Context(settings=settings, store=store)
        started = time.monotonic()
        await recover(ctx)
        elapsed = time.monotonic() - started
        counts = {s: states.count(s) for s in STATES}
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        print(f"recovery engine={engine} processes={processes} mix={mix} {counts} seconds={elapsed:.2f}", flush=True)
        again = time.monotonic()
        await recover(ctx)
        print(f"recovery again (nothing left to do) seconds={time.monotonic() - again:.2f}", flush=True)
    finally:
        await store.close()
        await drop_database(url)
        shutil.rmtree(workdir, ignore_errors=True)


async def populate(store: Store, disk: files.Disk, states: list[str], now: int) -> None:
    digest = hashlib.sha256(b"body").hexdigest()
    message_state = {"DONE": "GONE", "CANCELLED": "AVAILABLE", "CLEANUP": "COMMITTED", "READY_TO_COMMIT": "TAKEN",
                     "STARTED": "TAKEN"}
    batch = 5000
    for offset in range(0, len(states), batch):
        procs, msgs = [], []
        for i in range(offset, min(offset + batch, len(states))):
            state = states[i]
            pid, mid = f"p{i:012d}", f"m{i:012d}"
            live = state in ("STARTED", "READY_TO_COMMIT")
            # One active process per mailbox (the partial unique index): each live one gets its own.
            box = f"mobile-{i}" if live else f"mobile-{i % 100}"
            path = files.mailbox_path(box, "erp", mid)
            procs.append({"id": pid, "addressee": box, "database": "erp", "client_id": "g", "message_ids": [mid],
                          "state": state, "started_at": now, "deadline": now + 3_600_000 if live else None,
                          "updated_at": now, "cleanup_attempts": 0})
            msgs.append({"id": mid, "addressee": box, "database": "erp", "size": 4, "sha256": digest,
                         "content_type": "text/plain", "created_at": now, "state": message_state[state],
                         "process_id": pid, "path": None if state in ("DONE", "CLEANUP") else path,
                         "prev_path": path if state == "CLEANUP" else None, "file_version": 1,
                         "synced": state != "CLEANUP", "sync_attempts": 0, "next_sync_at": now})
            if state != "DONE":
                target = disk.full(path)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(b"body")
        async with store.transaction() as tx:
            await tx.execute(exchange_processes.insert(), procs)
            await tx.execute(exchange_messages.insert(), msgs)
    # On disk, as their fsyncs left them before the crash: deleting a file whose blocks are allocated costs
    # far more than deleting one still in the page cache (~1 ms on a disk mounted with discard).
    os.sync()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    cycles = sub.add_parser("cycles")
    cycles.add_argument("--engine", choices=["sqlite", "postgres"], default="sqlite")
    cycles.add_argument("--mailboxes", type=int, default=100)
    cycles.add_argument("--seconds", type=float, default=20)
    cycles.add_argument("--client", choices=["library", "httpx"], default="library",
                        help="drive the cycle through the Python client (mainspring.client), or through bare httpx calls")
    rec = sub.add_parser("recovery")
    rec.add_argument("--engine", choices=["sqlite", "postgres"], default="sqlite")
    rec.add_argument("--processes", type=int, default=100_000)
    rec.add_argument("--mix", choices=["inflight", "mostly-done"], default="inflight")
    args = parser.parse_args()
    if args.command == "cycles":
        asyncio.run(bench_cycles(args.engine, args.mailboxes, args.seconds, args.client == "library"))
    else:
        asyncio.run(bench_recovery(args.engine, args.processes, args.mix))


if __name__ == "__main__":
    main()
