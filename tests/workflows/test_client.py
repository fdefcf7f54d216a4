"""The SDK: ``WorkflowsClient`` and ``AsyncWorkflowsClient`` (API.md §5)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mainspring import App, Workflow
from mainspring.client import (
    AsyncWorkflowsClient,
    NotFound,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowsClient,
)


@pytest.fixture
def registry() -> App:
    app = App()

    @app.workflow("greetings")
    async def greet(wf: Workflow, args: Any) -> Any:
        if args == "fail":
            raise ValueError("no greeting")
        name = await wf.wait("name", timeout_ms=60_000) if args == "ask" else args
        return f"hello {name}"

    return app


async def test_the_async_client_starts_reads_signals_cancels_retries_and_lists(live_url: str) -> None:
    async with AsyncWorkflowsClient(live_url) as client:
        run = await client.start("greetings", "ann", id="r1")
        assert run["id"] == "r1" and (await client.start("greetings", "bob", id="r1"))["args"] == "ann"
        assert await client.result("greetings", "r1", timeout_s=20) == "hello ann"
        await client.start("greetings", "ask", id="r2")
        await client.signal("greetings", "r2", "name", "cid")
        assert await client.result("greetings", "r2", timeout_s=20) == "hello cid"
        await client.start("greetings", "fail", id="r3")
        with pytest.raises(WorkflowFailed) as failed:
            await client.result("greetings", "r3", timeout_s=20)
        assert failed.value.type == "ValueError" and failed.value.message == "no greeting"
        await client.start("greetings", "ask", id="r4")
        assert (await client.cancel("greetings", "r4"))["status"] == "cancelled"
        with pytest.raises(WorkflowCancelled):
            await client.result("greetings", "r4", timeout_s=20)
        await client.start("greetings", "ask", id="r5")
        with pytest.raises(TimeoutError):
            await client.result("greetings", "r5", timeout_s=0.2)
        assert (await client.retry("greetings", "r3"))["status"] == "running"
        assert sorted(r["id"] for r in [run async for run in client.list("greetings", limit=2)]) == ["r1", "r2", "r3", "r4", "r5"]
        assert [w["name"] for w in await client.workflows()] == ["greetings"]
        with pytest.raises(NotFound):
            await client.get("greetings", "missing")


async def test_the_sync_client_has_the_same_calls(live_url: str) -> None:
    def use() -> Any:
        with WorkflowsClient(live_url) as client:
            client.start("greetings", "dan", id="s1")
            assert client.get("greetings", "s1", wait_ms=10_000)["status"] == "completed"
            return client.result("greetings", "s1", timeout_s=10), [r["id"] for r in client.list("greetings", status="completed")]

    assert await asyncio.to_thread(use) == ("hello dan", ["s1"])
