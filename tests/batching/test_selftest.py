"""``mainspring selftest`` against a real server process."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from mainspring.batching.selftest import Scenario
from mainspring.client.batching import BatchingError
from tests.conftest import free_port


def assert_no_selftest_batchers(url: str) -> None:
    """The dashboard lists every batcher the server has."""
    page = httpx.get(f"{url}/ui/batching")
    assert page.status_code == 200, page.text[:500]
    assert "selftest-" not in page.text


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
    # It ran in isolated batchers, and removed each at the end of its run.
    removed = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("removed batcher selftest-")]
    assert len(removed) == 3, done.stdout
    for name in removed:
        assert httpx.get(f"{server.url}/v1/batchers/{name}").json()["code"] == "batcher_not_found"
    assert_no_selftest_batchers(server.url)

    packed = selftest("--url", server.url, "--linger-ms", "1500", "--depth", "packed", "--scenario", "odd")
    assert packed.returncode == 0, packed.stdout
    assert "claimed" not in packed.stdout.split("odd")[0]  # no column deeper than asked
    assert "incomplete_group" in packed.stdout
    assert "removed batcher selftest-" in packed.stdout
    assert_no_selftest_batchers(server.url)


class BrokenServer:
    """A client whose server fails the first step and records the cleanup."""

    def __init__(self) -> None:
        self.deleted: list[tuple[str, bool]] = []

    def put_batcher(self, name: str, **_settings: object) -> None:
        raise BatchingError(500, {"code": "internal", "detail": "boom"})

    def delete_batcher(self, name: str, force: bool = False) -> None:
        self.deleted.append((name, force))


def test_a_failed_scenario_still_removes_its_batcher() -> None:
    client = BrokenServer()
    outcome = Scenario(client, "run1", "pair", 1000).run("done")  # type: ignore[arg-type]
    assert not outcome.passed and outcome.results["accepted"][0] is False
    assert client.deleted == [("selftest-run1-pair", True)]
    assert outcome.cleanup == "removed"


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
    assert "removed batcher selftest-" in result.stdout
    books = httpx.get(f"{server.url}/v1/batchers/books").json()
    assert books["counts"]["pending"] == 1 and books["package_counts"]["ready"] == 0
