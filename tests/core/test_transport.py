"""The request head's bounds, on a real socket: uvicorn with the server's protocol (web/transport.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from mainspring.core.settings import ServerSettings
from mainspring.web import transport
from tests.heads import BIG_HEAD, TRICKLE, exchange


async def hello(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def port() -> AsyncIterator[int]:
    settings = ServerSettings(max_head_bytes=8192, head_timeout_ms=300, keep_alive_ms=1000)
    config = transport.uvicorn_config(hello, settings, host="127.0.0.1", port=0, lifespan="off")
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup()
    yield server.servers[0].sockets[0].getsockname()[1]
    await server.shutdown()
    transport.configure(ServerSettings())


async def test_a_head_over_the_limit_is_431_with_connection_close_before_it_ends(port: int) -> None:
    # One read's worth past the limit is answered; the rest (it would be 2 MB) is never read.
    answer, _ = await exchange(port, BIG_HEAD)
    assert answer.startswith(b"HTTP/1.1 431") and b"connection: close" in answer


async def test_a_head_within_the_limit_is_served(port: int) -> None:
    answer, _ = await exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Fine: " + b"a" * 4000 + b"\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200")


async def test_a_connection_that_sends_nothing_or_half_a_head_is_closed_at_the_head_timeout(port: int) -> None:
    silent, took = await exchange(port)
    assert silent.startswith(b"HTTP/1.1 408") and took < 3
    half, took = await exchange(port, *TRICKLE, pause_s=0.05)
    assert half.startswith(b"HTTP/1.1 408") and took < 3


async def test_after_an_answer_the_next_head_has_the_head_timeout_again(port: int) -> None:
    # The keep-alive timeout is 1 s: a 408 within it is the head timeout, armed again for the second head.
    request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    answer, took = await exchange(port, request, request, b"GET / HTTP/1.1\r\n", pause_s=0.05)
    assert answer.count(b"HTTP/1.1 200") == 2 and answer.endswith(b'"code":"request_timeout"}') and took < 3

