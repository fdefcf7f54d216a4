"""The clock_jump fault: a server's wall clock is stepped through a file, the monotonic clock is not."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.cluster import Clock, Server


def wall_and_monotonic_of_a_child(clock: Clock) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", "import time; print(time.time_ns() / 1e9, time.monotonic())"],
                         env={**clock.env(), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    wall, monotonic = out.stdout.split()
    return float(wall), float(monotonic)


def test_a_stepped_clock_moves_the_wall_clock_of_the_process_and_not_its_monotonic_clock(tmp_path: Path) -> None:
    clock = Clock(tmp_path / "clock.faketime")
    clock.set(-42.5)
    wall, monotonic = wall_and_monotonic_of_a_child(clock)
    assert wall - time.time() == pytest.approx(-42.5, abs=1.0)
    assert monotonic == pytest.approx(time.monotonic(), abs=1.0)
    clock.set(0.0)
    wall, _ = wall_and_monotonic_of_a_child(clock)
    assert wall == pytest.approx(time.time(), abs=1.0)


@pytest.mark.slow
async def test_a_jumped_server_shows_the_jump_in_its_date_header_and_keeps_serving(servers: Any, tmp_path: Path) -> None:
    clock = Clock(tmp_path / "clock.faketime")
    (process,) = servers(1, env=clock.env())
    server = Server(0, process, proxy=None, clock=clock)  # type: ignore[arg-type]
    assert abs(await server.observed_offset_s()) < 2
    clock.set(30.0)
    assert await offset_settles_near(server, 30.0)
    clock.set(0.0)
    assert await offset_settles_near(server, 0.0)


async def offset_settles_near(server: Server, expected: float) -> bool:
    """uvicorn renews its Date header once a second; the server re-reads the clock file every 100 ms."""
    for _ in range(40):
        if abs(await server.observed_offset_s() - expected) < 2:
            return True
        await asyncio.sleep(0.1)
    return False
