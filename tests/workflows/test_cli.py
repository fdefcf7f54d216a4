"""``mainspring workflows list|show|start|signal|cancel|retry`` against a live server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
from typer.testing import CliRunner

from mainspring import App, Workflow
from mainspring.workflows.cli import cli


@pytest.fixture
def registry() -> App:
    app = App()
    broken = [True]

    @app.workflow("orders")
    async def order(wf: Workflow, args: Any) -> Any:
        if args == "flaky" and broken[0]:
            broken[0] = False
            raise RuntimeError("first time")
        if args == "approve":
            return await wf.wait("approved")
        return args

    return app


async def run_cli(*args: str) -> Any:
    # The server under test runs on this event loop: the blocking CLI runs beside it.
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args))


async def test_an_operator_starts_signals_cancels_and_retries_runs_from_the_command_line(live_url: str) -> None:
    url = ["--url", live_url]
    started = await run_cli("start", "orders", "--id", "o1", "--args", '"hello"', "--wait", *url)
    assert started.exit_code == 0, started.output
    assert json.loads(started.output) == "hello"
    assert (await run_cli("start", "orders", "--id", "o2", "--args", '"approve"', *url)).exit_code == 0
    assert (await run_cli("signal", "orders", "o2", "approved", "--payload", '{"by": "ann"}', *url)).exit_code == 0
    waited = await run_cli("start", "orders", "--id", "o2", "--wait", *url)
    assert json.loads(waited.output) == {"by": "ann"}
    assert (await run_cli("start", "orders", "--id", "o3", "--args", '"approve"', *url)).exit_code == 0
    cancelled = await run_cli("cancel", "orders", "o3", *url)
    assert json.loads(cancelled.output)["status"] == "cancelled"
    again = await run_cli("cancel", "orders", "o3", *url)
    assert again.exit_code == 1 and "run_finished" in again.output
    assert (await run_cli("start", "orders", "--id", "o4", "--args", '"flaky"', *url)).exit_code == 0
    for _ in range(200):
        if json.loads((await run_cli("show", "orders", "o4", *url)).output)["status"] == "failed":
            break
        await asyncio.sleep(0.05)
    assert json.loads((await run_cli("retry", "orders", "o4", *url)).output)["status"] == "running"
    listed = await run_cli("list", "orders", "--json", *url)
    assert sorted(r["id"] for r in json.loads(listed.output)) == ["o1", "o2", "o3", "o4"]
    counted = json.loads((await run_cli("list", "--json", *url)).output)
    assert counted[0]["name"] == "orders" and sum(counted[0]["counts"].values()) == 4
    assert (await run_cli("list", "orders", "--status", "sleepy", *url)).exit_code == 2


def test_the_workflows_group_is_part_of_the_mainspring_command() -> None:
    shown = subprocess.run([sys.executable, "-m", "mainspring.cli", "workflows", "--help"], capture_output=True, text=True, check=False)
    assert shown.returncode == 0, shown.stderr
    assert all(command in shown.stdout for command in ("list", "show", "start", "signal", "cancel", "retry"))
