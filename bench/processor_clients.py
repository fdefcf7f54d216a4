"""The outbound HTTP client of processors, A/B: httpx vs httpcore vs aiohttp under 64 concurrent calls.

    .venv/bin/python -m bench.processor_clients [--requests 5000] [--concurrency 64] [--rounds 3] [--port P]

Each client POSTs the JSON processor request of a `call` step (a machine with a short history) to the no-op
processor of bench/machines_processors.py (its own process, one uvicorn worker) and reads the JSON answer, with
``concurrency`` calls in flight; the clients take turns (A, B, C, A, B, C…) so each sees the same machine load.
Per client: requests/s, latency p50/p99, and CPU per request of this process and of the processor's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import httpcore
import httpx

from bench.machines import free_port, percentile, process_cpu_s, serve_processor

BODY = {
    "kind": "call",
    "args": 17,
    "machine": {
        "namespace": "bench", "id": "m17", "status": "working", "aux_state": None,
        "history": [{"id": i, "created_at": "2026-11-27T10:00:00.000Z", "data": i} for i in range(1, 4)],
    },
}

Post = Callable[[bytes], Awaitable[Any]]


async def with_httpx(url: str, connections: int) -> tuple[Post, Callable[[], Awaitable[None]]]:
    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))

    async def post(body: bytes) -> Any:
        reply = await client.post(url, content=body, headers={"content-type": "application/json"}, timeout=10)
        return reply.json()

    return post, client.aclose


async def with_httpcore(url: str, connections: int) -> tuple[Post, Callable[[], Awaitable[None]]]:
    pool = httpcore.AsyncConnectionPool(max_connections=connections, max_keepalive_connections=connections)
    headers = [(b"content-type", b"application/json")]

    async def post(body: bytes) -> Any:
        reply = await pool.request("POST", url, headers=headers, content=body, extensions={"timeout": {"pool": 10, "read": 10, "connect": 10, "write": 10}})
        return json.loads(reply.content)

    return post, pool.aclose


async def with_aiohttp(url: str, connections: int) -> tuple[Post, Callable[[], Awaitable[None]]]:
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections), timeout=aiohttp.ClientTimeout(total=10))
    headers = {"content-type": "application/json"}

    async def post(body: bytes) -> Any:
        async with session.post(url, data=body, headers=headers) as reply:
            return json.loads(await reply.read())

    return post, session.close


CLIENTS = {"httpx": with_httpx, "httpcore": with_httpcore, "aiohttp": with_aiohttp}


async def run(client: str, url: str, requests: int, concurrency: int, connections: int, host_pid: int) -> dict[str, float]:
    post, close = await CLIENTS[client](url, connections)
    body = json.dumps(BODY).encode()
    await asyncio.gather(*(post(body) for _ in range(concurrency)))  # connections opened before the clock starts
    latencies: list[float] = []
    left = iter(range(requests))

    async def caller() -> None:
        for _ in left:
            started = time.perf_counter()
            await post(body)
            latencies.append((time.perf_counter() - started) * 1000)

    cpu = process_cpu_s(), process_cpu_s(host_pid)
    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    own_us, host_us = ((after - before) * 1e6 / requests for before, after in zip(cpu, (process_cpu_s(), process_cpu_s(host_pid)), strict=True))
    await close()
    return {"requests_per_s": round(requests / elapsed), "p50_ms": round(percentile(latencies, 0.5), 2), "p99_ms": round(percentile(latencies, 0.99), 2),
            "cpu_us_per_request_client": round(own_us), "cpu_us_per_request_processor": round(host_us)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=256, help="the pool's size (the server's default: 4 × machines.concurrency)")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--hosts", default="json", help="the processors called, in turn: json (mainspring.machines.host), raw (a bare ASGI app), or both: json,raw")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="the event loop (the server's is uvloop, as uvicorn picks it)")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(run_all(args))
    else:
        asyncio.run(run_all(args))


async def run_all(args: argparse.Namespace) -> None:
    hosts = {kind: ((args.port or free_port()) + i, None) for i, kind in enumerate(args.hosts.split(","))}
    hosts = {kind: (port, serve_processor(kind, port)) for kind, (port, _) in hosts.items()}
    results: dict[str, list[dict[str, float]]] = {}
    try:
        for _ in range(args.rounds):
            for kind, (port, host) in hosts.items():
                for client in args.clients.split(","):
                    result = await run(client, f"http://127.0.0.1:{port}/", args.requests, args.concurrency, args.connections, host.pid)
                    name = client if len(hosts) == 1 else f"{client}→{kind}"
                    results.setdefault(name, []).append(result)
                    print(name, result, flush=True)
    finally:
        for _, host in hosts.values():
            host.kill()
    print("medians:")
    for client, runs in results.items():
        print(client, {key: statistics.median(r[key] for r in runs) for key in runs[0]})


if __name__ == "__main__":
    main()
