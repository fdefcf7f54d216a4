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
