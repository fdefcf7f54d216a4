"""The create side beside PgQueuer's enqueue (issue 32), alternated round by round on the same PostgreSQL:

    .venv/bin/python -m bench.enqueue [--pg URL] [--single 2000] [--bulk 20000] [--rounds 3] [--sides mainspring,pgqueuer]
    .venv/bin/python -m bench.enqueue --sides before,mainspring --before-src /tmp/before/src    # a before/after pair

Per side and round, in a fresh database: one awaited enqueue at a time (Mainspring: ``mainspring.producer()``'s
``create``; PgQueuer: ``Queries.enqueue``), then bulk (1,000 per call: ``create_many``; ``enqueue`` of lists). For
each: the rate, this process's CPU per operation and PostgreSQL's (the database's own backends,
``bench.pgcpu.DatabaseCpu``). On a shared machine read the CPU per operation and the same-round ratios.

With ``--http SECONDS`` (Mainspring only: PgQueuer has no HTTP), ``wrk`` at 8 connections posts one create per
request (``../shared/bench/http/ia_create.lua``) to a ``mainspring serve`` on a fresh database: creates/s, the
server's CPU and PostgreSQL's CPU per create.

With ``--latency N``, create → handler start p50/p95 over N lone items: Mainspring's producer ``create`` to a
standalone ``mainspring worker`` process (``bench.latency_app``), PgQueuer's ``enqueue`` to a ``QueueManager`` in
another process (this module's ``pgqueuer-worker``), each start told back over UDP.

PgQueuer runs in the peers' venv (``--peers-python``, default ``bench/.peers-venv/bin/python``): this module is
run there as ``python -m bench.enqueue side pgqueuer …`` and prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg

from bench.pgcpu import DatabaseCpu

ROOT = Path(__file__).resolve().parent.parent
PEERS_PYTHON = str(Path(__file__).with_name(".peers-venv") / "bin" / "python")


async def fresh(pg_admin: str) -> str:
    name = f"msbench_enq_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(pg_admin)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    return pg_admin.rsplit("/", 1)[0] + "/" + name


async def drop(pg_admin: str, dsn: str) -> None:
    conn = await asyncpg.connect(pg_admin)
    await conn.execute(f'DROP DATABASE IF EXISTS "{dsn.rsplit("/", 1)[1]}" WITH (FORCE)')
    await conn.close()


class Meter:
    """Wall time, this process's CPU and the database's backends' CPU over a block of ``ops`` operations."""

    def __init__(self, dsn: str, label: str, ops: int, out: dict[str, float]) -> None:
        self.cpu, self.label, self.ops, self.out = DatabaseCpu(dsn), label, ops, out

    async def __aenter__(self) -> Meter:
        await self.cpu.start()
        self.began, self.cpu_began = time.perf_counter(), time.process_time()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        wall, own = time.perf_counter() - self.began, time.process_time() - self.cpu_began
        pg = await self.cpu.stop()
        self.out[f"{self.label}_per_s"] = self.ops / wall
        self.out[f"{self.label}_client_cpu_us"] = own / self.ops * 1e6
        self.out[f"{self.label}_pg_cpu_us"] = pg / self.ops * 1e6


async def mainspring_side(dsn: str, single: int, bulk: int) -> dict[str, float]:
    from mainspring.producer import producer

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with producer(database=dsn, data_dir=Path(tmp)) as mainspring:
            for i in range(100):  # the pool, the statement caches and the queue's row, as PgQueuer's install warms its own
                await mainspring.create("bench", {"n": i})
            async with Meter(dsn, "single", single, out):
                for i in range(single):
                    await mainspring.create("bench", {"n": i})
            async with Meter(dsn, "bulk", bulk, out):
                for start in range(0, bulk, 1000):
                    await mainspring.create_many("bench", [{"data": {"n": i}} for i in range(start, min(bulk, start + 1000))])
    return out


async def pgqueuer_side(dsn: str, single: int, bulk: int) -> dict[str, float]:
    from pgqueuer import AsyncpgDriver, Queries

    out: dict[str, float] = {}
    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    for _ in range(100):
        await queries.enqueue("noop", None)
    async with Meter(dsn, "single", single, out):
        for _ in range(single):
            await queries.enqueue("noop", None)
    async with Meter(dsn, "bulk", bulk, out):
        for start in range(0, bulk, 1000):
            n = min(1000, bulk - start)
            await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    await conn.close()
    return out


class _Arrivals(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.arrived = asyncio.Event()

    def datagram_received(self, data: bytes, _addr: Any) -> None:
        key, at = data.decode().split()
        self.started[key] = float(at)
        self.arrived.set()


async def latency_side(side: str, dsn: str, samples: int) -> dict[str, float]:
    """Create → handler start, one item at a time, the worker in a process of its own."""
    loop = asyncio.get_running_loop()
    transport, arrivals = await loop.create_datagram_endpoint(_Arrivals, local_addr=("127.0.0.1", 0))
    env = {**os.environ, "MS_LATENCY_PORT": str(transport.get_extra_info("sockname")[1]), "MAINSPRING_SERVER__LOG_LEVEL": "WARNING",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    worker: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if side == "mainspring":
                from mainspring.producer import producer

                async with producer(database=dsn, data_dir=Path(tmp)) as mainspring:
                    worker = subprocess.Popen([sys.executable, "-m", "mainspring.cli", "worker", "bench.latency_app:app",  # noqa: ASYNC220
                                               "--database", dsn, "--data-dir", tmp], env=env)

                    async def create() -> str:
                        return (await mainspring.create("latency", 1))["id"]

                    latencies = await _lone_items(create, arrivals, samples)
            else:
                from pgqueuer import AsyncpgDriver, Queries

                conn = await asyncpg.connect(dsn)
                queries = Queries(AsyncpgDriver(conn))
                await queries.install()
                worker = subprocess.Popen([sys.executable, "-m", "bench.enqueue", "pgqueuer-worker", dsn], env=env)  # noqa: ASYNC220

                async def create() -> str:
                    return str((await queries.enqueue("latency", None))[0])

                latencies = await _lone_items(create, arrivals, samples)
                await conn.close()
        finally:
            if worker is not None:
                worker.terminate()
                worker.wait(30)
            transport.close()
    latencies.sort()
    return {"latency_p50_ms": statistics.median(latencies), "latency_p95_ms": latencies[int(len(latencies) * 0.95) - 1]}


async def _lone_items(create: Any, arrivals: _Arrivals, samples: int) -> list[float]:
    latencies = []
    for i in range(samples + 20):
        arrivals.arrived.clear()
        sent = time.time()
        key = await create()
        while key not in arrivals.started:
            await asyncio.wait_for(arrivals.arrived.wait(), 60)
            arrivals.arrived.clear()
        if i >= 20:  # the first ones wait for the worker to start
            latencies.append((arrivals.started[key] - sent) * 1000)
        await asyncio.sleep(0.01)
    return latencies


async def pgqueuer_worker(dsn: str) -> None:
    import socket

    from pgqueuer import AsyncpgDriver, Queries, QueueManager

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    bench = ("127.0.0.1", int(os.environ["MS_LATENCY_PORT"]))
    qm = QueueManager(Queries(AsyncpgDriver(await asyncpg.connect(dsn))))

    @qm.entrypoint("latency")
    async def started(job: Any) -> None:
        probe.sendto(f"{job.id} {time.time()}".encode(), bench)

    await qm.run(dequeue_timeout=timedelta(seconds=30))  # documented defaults otherwise


async def http_side(dsn: str, seconds: int) -> dict[str, float]:
    """Creates over HTTP at 8 connections, and what the server and PostgreSQL spend per create."""
    from bench.request_path import free_port, tree_cpu_s, wait_ready, wrk

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "serve.log"
        proc = subprocess.Popen([sys.executable, "-m", "mainspring.cli", "serve", "--port", str(port), "--database", dsn,  # noqa: ASYNC220
                                 "--data-dir", tmp], env={**os.environ, "MAINSPRING_SERVER__LOG_LEVEL": "WARNING"},
                                stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(url, proc, log)
            env = {"QUEUE": "http"}
            # The shared probe, beside the repository (a worktree's clone sits one folder deeper than main's).
            probe = next(str(p / "shared/bench/http/ia_create.lua") for p in ROOT.parents if (p / "shared/bench/http/ia_create.lua").exists())
            await asyncio.to_thread(wrk, url, probe, 8, 1, env)  # warm: the queue's row, prepared statements
            pg = DatabaseCpu(dsn)
            await pg.start()
            server = tree_cpu_s(proc.pid)
            rps, _p50, _p99, bad, requests = await asyncio.to_thread(wrk, url, probe, 8, seconds, env)
            server = tree_cpu_s(proc.pid) - server
            pg_s = await pg.stop()
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(30)
    if bad:
        raise SystemExit(f"{bad} creates over HTTP failed")
    return {"http_create_c8_per_s": rps, "http_create_server_cpu_us": server / requests * 1e6, "http_create_pg_cpu_us": pg_s / requests * 1e6}


async def side_main(side: str, pg_admin: str, single: int, bulk: int, latency: int, http: int = 0) -> dict[str, float]:
    dsn = await fresh(pg_admin)
    try:
        if http:
            return await http_side(dsn, http)
        if latency:
            return await latency_side(side, dsn, latency)
        return await (mainspring_side if side == "mainspring" else pgqueuer_side)(dsn, single, bulk)
    finally:
        await drop(pg_admin, dsn)


def run_side(side: str, args: argparse.Namespace, latency: int, http: int = 0) -> dict[str, float]:
    python = args.peers_python if side == "pgqueuer" else sys.executable
    env = dict(os.environ)
    if side == "before":  # Mainspring from another source tree (``--before-src``), for a before/after pair
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.before_src, str(ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [python, "-m", "bench.enqueue", "side", "pgqueuer" if side == "pgqueuer" else "mainspring", "--pg", args.pg, "--single", str(args.single), "--bulk", str(args.bulk),
           "--latency", str(latency), "--http", str(http)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, check=False, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{side} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", nargs="*", help="(internal) side NAME, or pgqueuer-worker DSN")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--bulk", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=int, default=0, help="also create → handler start over this many lone items")
    parser.add_argument("--http", type=int, default=0, help="also creates over HTTP for this many seconds (Mainspring sides)")
    parser.add_argument("--sides", default="mainspring,pgqueuer")
    parser.add_argument("--peers-python", default=PEERS_PYTHON)
    parser.add_argument("--before-src", default="", help="the side 'before': Mainspring from this src folder (git archive … src)")
    args = parser.parse_args()
    if args.what[:1] == ["side"]:
        print(json.dumps(asyncio.run(side_main(args.what[1], args.pg, args.single, args.bulk, args.latency, args.http))))
        return
    if args.what[:1] == ["pgqueuer-worker"]:
        asyncio.run(pgqueuer_worker(args.what[1]))
        return
    sides = args.sides.split(",")
    rows: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for _ in range(args.rounds):
        for side in sides:
            measured = run_side(side, args, 0)
            if args.latency:
                measured.update(run_side(side, args, args.latency))
            if args.http and side != "pgqueuer":
                measured.update(run_side(side, args, 0, args.http))
            rows[side].append(measured)
            print(side, json.dumps({k: round(v, 2) for k, v in measured.items()}), f"load {os.getloadavg()[0]:.2f}", flush=True)
    if len(sides) == 2:
        keys = [k for k in rows[sides[0]][0] if k in rows[sides[1]][0]]
        print(f"| | {sides[0]} | {sides[1]} | ratio per round |\n| --- | --- | --- | --- |")
        for key in keys:
            ours = [r[key] for r in rows[sides[0]]]
            theirs = [r[key] for r in rows[sides[1]]]
            ratios = " · ".join(f"×{a / b:.2f}" if b else "—" for a, b in zip(ours, theirs, strict=True))
            print(f"| {key} | {' · '.join(f'{v:,.1f}' for v in ours)} | {' · '.join(f'{v:,.1f}' for v in theirs)} | {ratios} |")


if __name__ == "__main__":
    main()
