"""The request path's small parts, each alone, in process: the route table's look-up, a body ``receive`` under a
timeout (``asyncio.wait_for`` against ``asyncio.timeout``), the browser guard, the head timer's per-request
work. Run from each version (``PYTHONPATH=<other checkout>/src``) alternately to compare two commits:

    .venv/bin/python -m bench.request_parts [--rounds 7]

Prints per part the process CPU per call, least of the rounds (the figure least disturbed by the neighbours).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

import uvloop

from mainspring.api import FACES
from mainspring.core.settings import ServerSettings
from mainspring.web.guard import check_browser_request
from mainspring.web.routing import RouteTable

PATHS = [("POST", b"/v1/queues/emails/interactions"), ("GET", b"/v1/interactions/123"), ("POST", b"/v1/batchers/b/tasks")]
SCOPE = {"method": "POST", "headers": [
    (b"host", b"127.0.0.1:8080"), (b"user-agent", b"python-httpx/0.28"), (b"accept", b"*/*"), (b"accept-encoding", b"gzip"),
    (b"connection", b"keep-alive"), (b"content-type", b"application/json"), (b"content-length", b"18")]}


def least(call: Callable[[], object], rounds: int, n: int = 20_000) -> float:
    results = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(n):
            call()
        results.append((time.process_time() - started) / n * 1e6)
    return min(results)


async def main(rounds: int) -> None:
    table = RouteTable([op for face in FACES for op in face.routes.operations])
    settings = ServerSettings()
    print(f"route look-up, per request: {least(lambda: [table.find(m, p) for m, p in PATHS], rounds) / len(PATHS):.2f} µs")
    for open_server in (True, False):
        print(f"browser guard, {'open server' if open_server else 'with tokens'}: "
              f"{least(lambda o=open_server: check_browser_request(SCOPE, settings, open_server=o), rounds):.2f} µs")
    loop = asyncio.get_running_loop()
    print(f"head timer call_later + cancel: {least(lambda: loop.call_later(10, print).cancel(), rounds):.2f} µs; "
          f"loop.time(): {least(loop.time, rounds):.2f} µs")

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def wait_for() -> None:
        await asyncio.wait_for(receive(), 30)

    async def timeout() -> None:
        async with asyncio.timeout(30):
            await receive()

    for name, one in (("asyncio.wait_for", wait_for), ("asyncio.timeout", timeout)):
        results = []
        for _ in range(rounds):
            started = time.process_time()
            for _ in range(20_000):
                await one()
            results.append((time.process_time() - started) / 20_000 * 1e6)
        print(f"a body receive under {name}: {min(results):.2f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    uvloop.run(main(parser.parse_args().rounds))
