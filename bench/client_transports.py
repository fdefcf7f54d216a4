"""The Python clients' transport, A/B: CPU of the client process per call, one call at a time.

    .venv/bin/python -m bench.client_transports [--calls 3000] [--rounds 3] [--only sync|async] [--transports a,b]

One local server (a raw ASGI app under uvicorn with httptools, in a process of its own, answering every GET with
an interaction-sized JSON body and every POST with its body) and, in this process, each candidate transport
making ``calls`` keep-alive calls in a row (GET then POST, alternately), its JSON parsed: the work the Mainspring
clients do per call, without their own code. The candidates take turns (A, B, C, A, B, C…) so that each sees the
same machine load; per candidate, the median over rounds of this process's CPU time / calls (user + system,
``getrusage``), in µs. On a loaded machine read the ratios, not the rates.

Sync: httpx.Client (the clients today), httpcore.ConnectionPool, urllib3.HTTPConnectionPool, http.client (the
floor: the standard library's one connection, no pool). Async: httpx.AsyncClient, httpcore.AsyncConnectionPool,
aiohttp.ClientSession. ``mainspring-sync``/``mainspring-async``: the clients' own request path (retry policy,
error mapping) over whatever transport they use at the commit measured.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.machines import ROOT, free_port, process_cpu_s

ANSWER = json.dumps({
    "id": "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "queue": "default", "kind": "email.send", "status": "queued",
    "input": {"to": "someone@example.com", "subject": "hello"}, "output": None, "error": None, "attempts": 0,
    "created_at": "2026-11-29T07:00:00.000Z", "updated_at": "2026-11-29T07:00:00.000Z", "run_at": None,
    "version": 1,
}).encode()
POSTED = json.dumps({"queue": "default", "kind": "email.send", "input": {"to": "someone@example.com"}}).encode()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Every GET: ANSWER; every POST: its own body, 201."""
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    status, out = (201, body) if scope["method"] == "POST" else (200, ANSWER)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


def serve(port: int) -> subprocess.Popen[bytes]:
    """The server in a process of its own, once it answers."""
    proc = subprocess.Popen([sys.executable, "-m", "bench.client_transports", "--serve", str(port)], cwd=ROOT)
    for _ in range(600):  # up to a minute: a loaded machine starts Python slowly
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/")
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not start")


HEADERS = {"content-type": "application/json", "accept": "application/json"}
Call = Callable[[bool], Any]
"""One call: a POST (True) or a GET (False), answering the parsed JSON."""


def sync_httpx(base: str) -> tuple[Call, Callable[[], None]]:
    import httpx

    client = httpx.Client(base_url=base, timeout=10)

    def call(post: bool) -> Any:
        if post:
            return client.post("/interactions", content=POSTED, headers=HEADERS).json()
        return client.get("/interactions/1").json()

    return call, client.close


def sync_httpcore(base: str) -> tuple[Call, Callable[[], None]]:
    import httpcore

    pool = httpcore.ConnectionPool()
    headers = list(HEADERS.items())
    ext = {"timeout": {"connect": 10, "read": 10, "write": 10, "pool": 10}}

    def call(post: bool) -> Any:
        if post:
            return json.loads(pool.request("POST", base + "/interactions", headers=headers, content=POSTED, extensions=ext).content)
        return json.loads(pool.request("GET", base + "/interactions/1", extensions=ext).content)

    return call, pool.close


def sync_urllib3(base: str) -> tuple[Call, Callable[[], None]]:
    import urllib3

    pool = urllib3.connectionpool.connection_from_url(base, maxsize=10, timeout=urllib3.Timeout(10), retries=False)

    def call(post: bool) -> Any:
        if post:
            return json.loads(pool.urlopen("POST", "/interactions", body=POSTED, headers=HEADERS).data)
        return json.loads(pool.urlopen("GET", "/interactions/1", headers=HEADERS).data)

    return call, pool.close


def sync_http_client(base: str) -> tuple[Call, Callable[[], None]]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)

    def call(post: bool) -> Any:
        if post:
            conn.request("POST", "/interactions", body=POSTED, headers=HEADERS)
        else:
            conn.request("GET", "/interactions/1", headers=HEADERS)
        return json.loads(conn.getresponse().read())

    return call, conn.close


def sync_mainspring(base: str) -> tuple[Call, Callable[[], None]]:
    from mainspring.client import InteractionsClient

    client = InteractionsClient(base)

    def call(post: bool) -> Any:
        if post:
            return client._json("POST", "/interactions", idempotent=False, content=POSTED, headers=HEADERS)
        return client._json("GET", "/interactions/1", idempotent=True)

    return call, client.close


ACall = Callable[[bool], Awaitable[Any]]


async def async_httpx(base: str) -> tuple[ACall, Callable[[], Awaitable[None]]]:
    import httpx

    client = httpx.AsyncClient(base_url=base, timeout=10)

    async def call(post: bool) -> Any:
        if post:
            return (await client.post("/interactions", content=POSTED, headers=HEADERS)).json()
        return (await client.get("/interactions/1")).json()

    return call, client.aclose


async def async_httpcore(base: str) -> tuple[ACall, Callable[[], Awaitable[None]]]:
    import httpcore

    pool = httpcore.AsyncConnectionPool()
    headers = list(HEADERS.items())
    ext = {"timeout": {"connect": 10, "read": 10, "write": 10, "pool": 10}}

    async def call(post: bool) -> Any:
        if post:
            return json.loads((await pool.request("POST", base + "/interactions", headers=headers, content=POSTED, extensions=ext)).content)
        return json.loads((await pool.request("GET", base + "/interactions/1", extensions=ext)).content)

    return call, pool.aclose


async def async_aiohttp(base: str) -> tuple[ACall, Callable[[], Awaitable[None]]]:
    import aiohttp

    session = aiohttp.ClientSession(base_url=base, cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=10))

    async def call(post: bool) -> Any:
        if post:
            async with session.post("/interactions", data=POSTED, headers=HEADERS) as reply:
                return json.loads(await reply.read())
        async with session.get("/interactions/1", headers=HEADERS) as reply:
            return json.loads(await reply.read())

    return call, session.close


async def async_mainspring(base: str) -> tuple[ACall, Callable[[], Awaitable[None]]]:
    from mainspring.client import AsyncInteractionsClient

    client = AsyncInteractionsClient(base)

    async def call(post: bool) -> Any:
        if post:
            return await client._json("POST", "/interactions", idempotent=False, content=POSTED, headers=HEADERS)
        return await client._json("GET", "/interactions/1", idempotent=True)

    return call, client.aclose


SYNC = {"httpx": sync_httpx, "httpcore": sync_httpcore, "urllib3": sync_urllib3, "http.client": sync_http_client,
        "mainspring-sync": sync_mainspring}
ASYNC = {"httpx-async": async_httpx, "httpcore-async": async_httpcore, "aiohttp": async_aiohttp,
         "mainspring-async": async_mainspring}


def run_sync(name: str, base: str, calls: int) -> float:
    call, close = SYNC[name](base)
    for i in range(20):  # the connection opened, the imports done, before the clock starts
        call(i % 2 == 0)
    before = process_cpu_s()
    for i in range(calls):
        call(i % 2 == 0)
    spent = process_cpu_s() - before
    close()
    return spent * 1e6 / calls


async def run_async(name: str, base: str, calls: int) -> float:
    call, close = await ASYNC[name](base)
    for i in range(20):
        await call(i % 2 == 0)
    before = process_cpu_s()
    for i in range(calls):
        await call(i % 2 == 0)
    spent = process_cpu_s() - before
    await close()
    return spent * 1e6 / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("sync", "async"), default=None)
    parser.add_argument("--transports", default=None, help="a comma-separated subset of: " + ",".join([*SYNC, *ASYNC]))
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        import uvicorn

        uvicorn.run(app, host="127.0.0.1", port=args.serve, log_level="warning", http="httptools", lifespan="off")
        return
    names = args.transports.split(",") if args.transports else [
        *([] if args.only == "async" else SYNC), *([] if args.only == "sync" else ASYNC)]
    port = free_port()
    server = serve(port)
    base = f"http://127.0.0.1:{port}"
    results: dict[str, list[float]] = {name: [] for name in names}
    try:
        for _ in range(args.rounds):
            for name in names:
                us = run_sync(name, base, args.calls) if name in SYNC else asyncio.run(run_async(name, base, args.calls))
                results[name].append(us)
                print(f"{name:18} {us:8.0f} µs/call", flush=True)
    finally:
        server.kill()
    print("medians (client CPU per call, µs):")
    for name, runs in results.items():
        print(f"{name:18} {statistics.median(runs):8.0f}")


if __name__ == "__main__":
    main()
