"""A sleeping or waiting run holds no coroutine for long: at most ``keep_max`` are kept, for ``keep_ms``; the rest
are replayed when they wake. A run whose id is too long for a task's message id is named by its machine."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mainspring import App, Complete, Interaction, Workflow
from mainspring.config import Settings
from mainspring.store import ManualClock
from mainspring.workflows.runner import runner_of
from tests.conftest import eventually
from tests.workflows.conftest import finished, until_status


@pytest.fixture
def registry() -> App:
    app = App()

    @app.queue("echo")
    async def echo(item: Interaction) -> Any:
        return Complete(item.data)

    return app


async def test_waiting_runs_keep_at_most_keep_max_coroutines_and_the_others_are_replayed(
        registry: App, app: Any, client: httpx.AsyncClient, settings: Settings) -> None:
    settings.workflows.keep_max = 2

    @registry.workflow("waiters")
    async def waiter(wf: Workflow, args: Any) -> Any:
        return await wf.wait("go")

    for n in range(5):
        assert (await client.post("/v1/workflows/waiters/runs", json={"id": f"w{n}"})).status_code == 201
    for n in range(5):
        await until_status(client, "waiters", f"w{n}", "waiting")
    runner = runner_of(app.state.context)

    async def parked() -> bool:
        return not runner.active

    await eventually(parked, what="every run parked")
    assert len(runner.parked) <= 2
    for n in range(5):
        assert (await client.post(f"/v1/workflows/waiters/runs/w{n}/signals/go", json={"payload": n})).status_code == 202
    assert [(await finished(client, "waiters", f"w{n}"))["result"] for n in range(5)] == [0, 1, 2, 3, 4]


async def test_a_parked_coroutine_is_dropped_after_keep_ms(registry: App, app: Any, client: httpx.AsyncClient, settings: Settings,
                                                           clock: ManualClock) -> None:
    settings.workflows.keep_ms = 1000

    @registry.workflow("idle")
    async def idle(wf: Workflow, args: Any) -> Any:
        return await wf.wait("go")

    assert (await client.post("/v1/workflows/idle/runs", json={"id": "i"})).status_code == 201
    await until_status(client, "idle", "i", "waiting")
    runner = runner_of(app.state.context)

    async def parked() -> bool:
        return len(runner.parked) == 1

    await eventually(parked, what="the run parked")
    clock.advance(1000)
    await runner.step()
    assert not runner.parked


async def test_a_task_of_a_run_with_a_long_id_is_named_by_its_machine(registry: App, client: httpx.AsyncClient) -> None:
    @registry.workflow("echoes")
    async def echoes(wf: Workflow, args: Any) -> Any:
        return await wf.task("echo", {"said": "hi"})

    long_id = "x" * 500
    assert (await client.post("/v1/workflows/echoes/runs", json={"id": long_id})).status_code == 201
    run = await finished(client, "echoes", long_id)
    assert run["result"] == {"said": "hi"}
    item = (await client.get(f"/v1/interactions/{run['steps'][0]['task']}")).json()
    assert item["message_id"].startswith("wf:echoes:#") and item["message_id"].endswith(":1")
