"""Probes of a port's request-head bounds on a real socket (web/transport.py): shared by the tests of every port
Mainspring serves HTTP on."""

from __future__ import annotations

import asyncio
import time

BIG_HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 60_000
"""Past any ``max_head_bytes`` the tests configure (8 KiB), and never ended."""
TRICKLE = (b"GET /healthz HTTP/1.1\r\n", b"Host: x\r\n", b"X-A: 1\r\n")
"""A head sent a line at a time and never finished."""


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


async def assert_heads_bounded(port: int) -> None:
    """The port answers a head over its limit with 431 and ``connection: close``, and closes (408) a connection
    that sends nothing or never finishes its head — with a head timeout well under the 3 s allowed here."""
    big, _ = await exchange(port, BIG_HEAD)
    assert big.startswith(b"HTTP/1.1 431") and b"connection: close" in big, big[:200]
    silent, took = await exchange(port)
    assert silent.startswith(b"HTTP/1.1 408") and took < 3, (silent[:200], took)
    half, took = await exchange(port, *TRICKLE, pause_s=0.05)
    assert half.startswith(b"HTTP/1.1 408") and took < 3, (half[:200], took)
