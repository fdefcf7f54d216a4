"""``mainspring worker mod:app`` runs the app's workflows (on the store), as ``serve --app`` does."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from mainspring.app import AppError
from mainspring.config import Settings
from mainspring.worker import Remote, run, runnable
from tests.conftest import eventually
from tests.workflows.workerapp import app


def test_a_worker_says_it_runs_the_apps_workflows() -> None:
    assert runnable(app) == "workflows naps"


async def test_a_worker_takes_over_the_runs_of_a_killed_server(servers: Any, settings: Settings, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_DIR", str(tmp_path))
    # The server leases a sleeping run up to timer_lookahead_ms before its timer: killed then, it holds the run
    # until that lease lapses (lease_ms plus the machines' margin), so a short lease keeps the takeover quick.
    env = {"WORKER_DIR": str(tmp_path), "MAINSPRING_WORKFLOWS__LEASE_MS": "1000", "MAINSPRING_MACHINES__LEASE_MARGIN_MS": "500"}
    (server,) = servers(1, env=env, args=["--app", "tests.workflows.workerapp:app"])
    async with httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.post("/v1/workflows/naps/runs", json={"id": "n1"})).status_code == 201
        await eventually(lambda: _status(client, "n1", "sleeping"), what="the run sleeping")
    server.kill()
    stop, started = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(run(settings, app, stop=stop, started=started))
    await asyncio.wait_for(started.wait(), 30)
    try:
        (reader,) = servers(1)  # no --app: it reads runs, it does not advance them
        async with httpx.AsyncClient(base_url=reader.url) as client:
            done = await eventually(lambda: _status(client, "n1", "completed"), within_s=30, what="the run completed by the worker")
        assert done["result"] == ["before", "after"]
        calls = (tmp_path / "calls.txt").read_text().split()
        assert calls == ["before", calls[1], "after", str(os.getpid())] and calls[1] != str(os.getpid())
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)


async def _status(client: httpx.AsyncClient, run_id: str, status: str) -> Any:
    run = (await client.get(f"/v1/workflows/naps/runs/{run_id}")).json()
    return run if run.get("status") == status else None


async def test_a_worker_through_http_refuses_workflows(settings: Settings) -> None:
    with pytest.raises(AppError, match="run on the store"):
        await run(settings, app, remote=Remote("http://127.0.0.1:9"))
