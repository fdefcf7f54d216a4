"""Exactly once in effect across a server killed with SIGKILL (a real process) between a step's return and its record."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx


def test_a_step_whose_record_was_not_committed_runs_again_with_the_same_key_and_no_recorded_step_does(
        servers: Any, tmp_path: Path) -> None:
    env = {"CRASH_DIR": str(tmp_path), "MAINSPRING_WORKFLOWS__LEASE_MS": "1000"}
    (first,) = servers(1, env=env, args=["--app", "tests.workflows.crashapp:app"])
    assert httpx.post(f"{first.url}/v1/workflows/crashy/runs", json={"id": "k1"}).status_code == 201
    deadline = time.monotonic() + 60
    while not (tmp_path / "frozen").exists():
        assert time.monotonic() < deadline, first.log()
        time.sleep(0.05)
    first.kill()  # SIGKILL: the second step returned, its record never committed

    (second,) = servers(1, env=env, args=["--app", "tests.workflows.crashapp:app"])
    run: dict[str, Any] = {}
    while time.monotonic() < deadline + 60:
        run = httpx.get(f"{second.url}/v1/workflows/crashy/runs/k1", params={"wait_ms": 1000}).json()
        if run["status"] == "completed":
            break
    assert run["status"] == "completed", (run, second.log())
    assert run["result"] == ["one", {"two": 2}, "three"]
    calls = (tmp_path / "calls.txt").read_text().split("\n")[:-1]
    assert calls == ["first wf:crashy:k1:1", "second wf:crashy:k1:2", "second wf:crashy:k1:2", "third wf:crashy:k1:3"]


def test_a_run_created_with_its_servers_lease_is_resumed_elsewhere_when_that_server_dies_before_its_first_step(
        servers: Any, tmp_path: Path) -> None:
    env = {"CRASH_DIR": str(tmp_path), "MAINSPRING_WORKFLOWS__LEASE_MS": "1000"}
    (first,) = servers(1, env=env, args=["--app", "tests.workflows.crashapp:app"])
    try:
        # 201 once committed; the answer may not leave a server that froze right after (a timeout then).
        answer = httpx.post(f"{first.url}/v1/workflows/frozen_at_start/runs", json={"id": "s1"}, timeout=5)
        assert answer.status_code == 201
    except httpx.TimeoutException:
        pass
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline, first.log()
        time.sleep(0.05)
    first.kill()  # SIGKILL: the run is stored with this server's lease and nothing else

    (second,) = servers(1, env=env, args=["--app", "tests.workflows.crashapp:app"])
    run: dict[str, Any] = {}
    while time.monotonic() < deadline + 60:
        run = httpx.get(f"{second.url}/v1/workflows/frozen_at_start/runs/s1", params={"wait_ms": 1000}).json()
        if run.get("status") == "completed":
            break
    assert run["status"] == "completed", (run, second.log())
    assert run["result"] == "done"
    assert [s["kind"] for s in run["steps"]] == ["step"]
    assert (tmp_path / "calls.txt").read_text().split("\n")[:-1] == ["only wf:frozen_at_start:s1:1"]
