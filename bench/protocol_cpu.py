"""CPU per request of the HTTP layer in process, without sockets or ``wrk``: the server's uvicorn protocol (as
``mainspring serve`` configures it) fed the bytes of a request through an in-memory transport, on uvloop, the
real app behind it (SQLite in a temporary directory). What it leaves out — the kernel's socket work and the
load of the neighbours — is what makes a ``wrk`` run on a shared machine noisy, so it tells a change of the
request path's own cost from noise, to a few µs.

    .venv/bin/python -m bench.protocol_cpu [--rounds 7] [--requests 2000] [--paths healthz,create,get,refused]

Compare two commits by running it alternately from each (``PYTHONPATH=<other checkout>/src``) on the same
machine; prints per path the process CPU (user+sys) per request, median of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import uvicorn
import uvloop
from uvicorn.server import ServerState

from mainspring.api import create_app
from mainspring.config import load_settings
from mainspring.store import Store
from mainspring.store.migrate import migrate

HEAD = "Host: 127.0.0.1:8080\r\nUser-Agent: bench\r\nAccept: */*\r\n"


def post(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\n{HEAD}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


REQUESTS = {
    "healthz": f"GET /healthz HTTP/1.1\r\n{HEAD}\r\n".encode(),
    "create": post("/v1/queues/bench/interactions", b'{"data": {"n": 1}}'),
    "get": f"GET /v1/interactions/1 HTTP/1.1\r\n{HEAD}\r\n".encode(),
    # The whole path of a write short of the store: route, guard, permission, body read and validation (422).
    "refused": post("/v1/queues/bench/interactions", b'{"priority": "x"}'),
}


class MemoryTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 40000)}.get(name, default)


def server_config(app: Any, settings: Any) -> uvicorn.Config:
    """The uvicorn config ``mainspring serve`` builds, in whichever version of the code is on the path."""
    try:
        from mainspring.web.transport import uvicorn_config
    except ImportError:
        try:
            from mainspring.web import transport
        except ImportError:  # before the head-bounded protocol
            return uvicorn.Config(app, log_config=None, access_log=False, http="httptools")
        return uvicorn.Config(app, log_config=None, access_log=False, http=transport.configure(settings.server))
    return uvicorn_config(app, settings.server)


async def main(rounds: int, requests: int, paths: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(None, server={"database": f"sqlite:///{Path(tmp) / 'm.db'}", "data_dir": Path(tmp) / "data",
                                               "log_level": "WARNING"})
        store = Store(settings.server.database_url())
        await store.start()
        await migrate(store)
        app = create_app(settings, store=store)
        config = server_config(app, settings)
        config.load()
        async with app.router.lifespan_context(app):
            protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
            transport = MemoryTransport()
            protocol.connection_made(transport)
            done = asyncio.Event()
            answered = protocol.on_response_complete

            def on_response_complete() -> None:
                answered()
                done.set()

            protocol.on_response_complete = on_response_complete  # type: ignore[method-assign]

            async def one(raw: bytes) -> None:
                done.clear()
                protocol.data_received(raw)
                await done.wait()

            await one(REQUESTS["create"])
            rows: dict[str, list[float]] = {}
            for _ in range(rounds):
                for name in paths:
                    raw = REQUESTS[name]
                    for _ in range(50):  # warm
                        await one(raw)
                    started = time.process_time()
                    for _ in range(requests):
                        await one(raw)
                    rows.setdefault(name, []).append((time.process_time() - started) / requests * 1e6)
            protocol.connection_lost(None)
    # The least of the rounds is the figure least disturbed by the neighbours; the median beside it.
    print(f"load {os.getloadavg()[0]:.1f}; µs CPU per request, least · median of {rounds} rounds of {requests}: " +
          ", ".join(f"{name} {min(v):.1f} · {sorted(v)[rounds // 2]:.1f}" for name, v in rows.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--paths", default=",".join(REQUESTS), help=f"of {', '.join(REQUESTS)}")
    args = parser.parse_args()
    uvloop.run(main(args.rounds, args.requests, args.paths.split(",")))
