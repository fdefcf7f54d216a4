"""The request head's bounds, on a real socket: uvicorn with the server's protocol (web/transport.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from mainspring.core.settings import ServerSettings
from mainspring.web import transport


async def hello(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def port() -> AsyncIterator[int]:
    protocol = transport.configure(ServerSettings(max_head_bytes=8192, head_timeout_ms=300))
    config = uvicorn.Config(hello, host="127.0.0.1", port=0, http=protocol, lifespan="off", log_config=None, timeout_keep_alive=1)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup()
    yield server.servers[0].sockets[0].getsockname()[1]
    await server.shutdown()
    transport.configure(ServerSettings())


async def exchange(port: int, *parts: bytes, pause_s: float = 0) -> tuple[bytes, float]:
    """Send ``parts``, read until the server closes; answers what it sent and how long that took."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    answer = b""
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause_s)
        answer = await asyncio.wait_for(reader.read(), 5)
    except ConnectionError:
        pass  # the server closed while we were still sending (what a bound is for)
    finally:
        writer.transport.abort()
    return answer, time.monotonic() - started


async def test_a_head_over_the_limit_is_431_with_connection_close_before_it_ends(port: int) -> None:
    # One read's worth past the limit is answered; the rest (it would be 2 MB) is never read.
    answer, _ = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 60_000)
    assert answer.startswith(b"HTTP/1.1 431") and b"connection: close" in answer


async def test_a_head_within_the_limit_is_served(port: int) -> None:
    answer, _ = await exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Fine: " + b"a" * 4000 + b"\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200")


async def test_a_connection_that_sends_nothing_or_half_a_head_is_closed_at_the_head_timeout(port: int) -> None:
    silent, took = await exchange(port)
    assert silent.startswith(b"HTTP/1.1 408") and took < 3
    trickle = [b"GET / HTTP/1.1\r\n", b"Host: x\r\n", b"X-A: 1\r\n"]
    half, took = await exchange(port, *trickle, pause_s=0.05)
    assert half.startswith(b"HTTP/1.1 408") and took < 3
