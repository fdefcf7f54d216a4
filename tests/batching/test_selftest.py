"""``mainspring selftest`` against a real server process."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.conftest import free_port


def selftest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mainspring.cli", "selftest", *args],
        capture_output=True, text=True, timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.slow
@pytest.mark.timeout(600)  # real server processes on a shared, busy machine
def test_selftest_passes_every_scenario_at_every_depth_against_a_live_server(servers) -> None:
    (server,) = servers(1)
    done = selftest("--url", server.url, "--linger-ms", "4000")  # real time: room for a loaded CI machine
    assert done.returncode == 0, done.stdout + done.stderr
    for scenario in ("pair", "overflow", "odd"):
        row = next(line for line in done.stdout.splitlines() if f" {scenario} " in line)
        assert row.count("PASS") == 4 and "FAIL" not in row, row
    # It ran in isolated batchers, which the server still lists as ordinary ones.
    names = [line for line in done.stdout.splitlines() if "selftest" in line]
    assert names

    packed = selftest("--url", server.url, "--linger-ms", "1500", "--depth", "packed", "--scenario", "odd")
    assert packed.returncode == 0, packed.stdout
    assert "claimed" not in packed.stdout.split("odd")[0]  # no column deeper than asked
    assert "incomplete_group" in packed.stdout


def test_selftest_fails_with_a_non_zero_exit_when_the_server_is_unreachable() -> None:
    result = selftest("--url", f"http://127.0.0.1:{free_port()}", "--depth", "accepted")
    assert result.returncode == 1
    assert "FAIL" in result.stdout and "unreachable" in result.stdout


def test_selftest_refuses_an_unknown_depth() -> None:
    result = selftest("--depth", "deepest")
    assert result.returncode == 2


def test_a_server_answers_the_seed_scenarios_own_batcher_untouched(servers) -> None:
    (server,) = servers(1)
    httpx.put(f"{server.url}/v1/batchers/books", json={"linger_ms": 60_000}).raise_for_status()
    httpx.post(f"{server.url}/v1/batchers/books/tasks", json={"id": "real", "group": "g", "member": "en", "content": "x"}).raise_for_status()
    result = selftest("--url", server.url, "--linger-ms", "1000", "--scenario", "pair")
    assert result.returncode == 0, result.stdout
    books = httpx.get(f"{server.url}/v1/batchers/books").json()
    assert books["counts"]["pending"] == 1 and books["package_counts"]["ready"] == 0
