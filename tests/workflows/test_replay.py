"""Replay, versioning, nondeterminism, cancel and retry (API.md §5's second paragraph and its table)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import httpx
import pytest

from mainspring import App, Workflow
from mainspring.config import Settings
from mainspring.machines import driven
from mainspring.store import ManualClock
from mainspring.workflows.runner import runner_of
from tests.workflows.conftest import finished, run_of, until_status


async def start(client: httpx.AsyncClient, name: str, run_id: str, args: Any = None) -> None:
    answer = await client.post(f"/v1/workflows/{name}/runs", json={"id": run_id, "args": args})
    assert answer.status_code == 201, answer.text


async def test_a_replayed_run_calls_no_recorded_step_again(registry: App, client: httpx.AsyncClient, clock: ManualClock, settings: Settings) -> None:
    settings.workflows.keep_ms = 0  # every wake replays from the history
    calls: list[str] = []

    async def work(label: str) -> str:
        calls.append(label)
        return label.upper()

    @registry.workflow("replayed")
    async def replayed(wf: Workflow, args: Any) -> Any:
        first = await wf.step(work, "a")
        both = await asyncio.gather(wf.step(work, "b", name="b"), wf.step(work, "c", name="c"))
        await wf.sleep(1000)
        later = await wf.step(work, "d")
        await wf.sleep(1000)
        return [first, *both, later]

    await start(client, "replayed", "r1")
    await until_status(client, "replayed", "r1", "sleeping")
    clock.advance(1000)
    for _ in range(400):
        run = await run_of(client, "replayed", "r1")
        if len(run["steps"]) == 6 and run["status"] == "sleeping":
            break
        await asyncio.sleep(0.05)
    assert [s["kind"] for s in run["steps"]] == ["step", "step", "step", "sleep", "step", "sleep"]
    clock.advance(1000)
    run = await finished(client, "replayed", "r1")
    assert run["result"] == ["A", "B", "C", "D"]
    assert sorted(calls) == ["a", "b", "c", "d"]  # each once, though the run was replayed twice


async def test_a_replay_that_meets_another_call_fails_the_run_with_nondeterminism_and_retry_resumes_it(
        registry: App, client: httpx.AsyncClient, clock: ManualClock, settings: Settings) -> None:
    settings.workflows.keep_ms = 0

    async def reserve() -> str:
        return "reserved"

    async def charge() -> str:
        return "charged"

    async def old(wf: Workflow, args: Any) -> Any:
        stock = await wf.step(reserve)
        await wf.sleep(1000)
        return stock

    async def changed(wf: Workflow, args: Any) -> Any:
        stock = await wf.step(charge)  # another call where the history has `reserve`
        await wf.sleep(1000)
        return stock

    registry.workflow("versioned")(old)
    await start(client, "versioned", "v1")
    await until_status(client, "versioned", "v1", "sleeping")
    registry.workflows["versioned"].target = changed
    clock.advance(1000)
    run = await finished(client, "versioned", "v1")
    assert run["status"] == "failed" and run["error"]["type"] == "nondeterminism"
    assert "reserve" in run["error"]["message"] and [s["name"] for s in run["steps"]] == ["reserve", None]
    machine = (await client.get("/v1/namespaces/versioned/machines/v1")).json()
    assert machine["status"] == "failed"

    registry.workflows["versioned"].target = old  # fixed code is deployed
    retried = await client.post("/v1/workflows/versioned/runs/v1/retry")
    assert retried.status_code == 200 and retried.json()["status"] == "running"
    run = await finished(client, "versioned", "v1")
    assert run["status"] == "completed" and run["result"] == "reserved"


async def test_patched_is_false_on_a_history_recorded_before_it_and_true_on_new_runs(
        registry: App, client: httpx.AsyncClient, clock: ManualClock, settings: Settings) -> None:
    settings.workflows.keep_ms = 0

    async def old(wf: Workflow, args: Any) -> Any:
        await wf.sleep(1000)
        return "old path"

    async def new(wf: Workflow, args: Any) -> Any:
        if wf.patched("express"):
            await wf.sleep(10)
            return "new path"
        await wf.sleep(1000)
        return "old path"

    registry.workflow("shipping")(old)
    await start(client, "shipping", "before")
    await until_status(client, "shipping", "before", "sleeping")
    registry.workflows["shipping"].target = new
    await start(client, "shipping", "after")
    await until_status(client, "shipping", "after", "sleeping")
    clock.advance(1000)
    before, after = await finished(client, "shipping", "before"), await finished(client, "shipping", "after")
    assert before["result"] == "old path" and after["result"] == "new path"
    assert [s["kind"] for s in after["steps"]] == ["patch", "sleep"] and after["steps"][0]["name"] == "express"


async def test_an_exception_fails_the_run_and_retry_reruns_it_without_calling_recorded_steps(registry: App, client: httpx.AsyncClient) -> None:
    calls: list[int] = []
    broken = [True]

    def pay() -> int:
        calls.append(1)
        return 10

    @registry.workflow("bills")
    async def bill(wf: Workflow, args: Any) -> Any:
        paid = await wf.step(pay)
        if broken[0]:
            raise KeyError("no address")
        return paid

    await start(client, "bills", "b1")
    run = await finished(client, "bills", "b1")
    assert run["status"] == "failed" and run["error"]["type"] == "KeyError" and "no address" in run["error"]["traceback"]
    broken[0] = False
    assert (await client.post("/v1/workflows/bills/runs/b1/retry")).status_code == 200
    run = await finished(client, "bills", "b1")
    assert run["status"] == "completed" and run["result"] == 10 and calls == [1]


async def test_cancel_raises_CancelledError_at_the_current_await_and_compensation_steps_are_recorded(
        registry: App, client: httpx.AsyncClient, clock: ManualClock) -> None:
    done: list[str] = []

    async def release(sku: str) -> str:
        done.append(sku)
        return f"released {sku}"

    @registry.workflow("carts")
    async def cart(wf: Workflow, args: Any) -> Any:
        try:
            await asyncio.gather(wf.wait("approved"), wf.child("carts", f"{wf.id}-child", "leaf") if args != "leaf" else wf.sleep(10**9))
        except asyncio.CancelledError:
            await wf.step(release, args)
            raise
        return "approved"

    await start(client, "carts", "c1", "sku-1")
    await until_status(client, "carts", "c1", "waiting")
    await until_status(client, "carts", "c1-child", "waiting")
    cancelled = await client.post("/v1/workflows/carts/runs/c1/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    for _ in range(200):
        run = await run_of(client, "carts", "c1")
        if any(s["name"] == "release" for s in run["steps"]):
            break
        await asyncio.sleep(0.05)
    assert run["status"] == "cancelled"
    assert next(s for s in run["steps"] if s["kind"] == "step")["result"] == "released sku-1"
    for _ in range(200):
        child = await run_of(client, "carts", "c1-child")
        if any(s["name"] == "release" for s in child["steps"]):
            break
        await asyncio.sleep(0.05)
    assert child["status"] == "cancelled" and done.count("sku-1") == 1 and done.count("leaf") == 1
    assert (await client.post("/v1/workflows/carts/runs/c1/signals/approved", json={})).status_code == 409


async def test_the_machines_face_shows_the_same_run_and_its_events_are_on_the_outbox(registry: App, client: httpx.AsyncClient) -> None:
    async def one() -> int:
        return 1

    @registry.workflow("visible")
    async def visible(wf: Workflow, args: Any) -> Any:
        if args == "fail":
            raise RuntimeError("boom")
        return await wf.step(one)

    await start(client, "visible", "ok")
    await start(client, "visible", "bad", "fail")
    await finished(client, "visible", "ok")
    await finished(client, "visible", "bad")
    machine = (await client.get("/v1/namespaces/visible/machines/ok")).json()
    assert [e["data"]["wf"] for e in machine["history"]] == ["start", "step", "end"]
    events = (await client.get("/v1/events", params={"types": "workflow.started,workflow.completed,workflow.failed"})).json()["events"]
    assert sorted((e["type"], e["data"]["id"]) for e in events) == [
        ("workflow.completed", "ok"), ("workflow.failed", "bad"), ("workflow.started", "bad"), ("workflow.started", "ok")]
    listed = (await client.get("/v1/workflows")).json()["workflows"]
    assert listed == [{"name": "visible", "counts": {"running": 0, "sleeping": 0, "waiting": 0, "completed": 1, "failed": 1, "cancelled": 0}}]
    failed = (await client.get("/v1/workflows/visible/runs", params={"status": "failed"})).json()
    assert [r["id"] for r in failed["runs"]] == ["bad"] and "steps" not in failed["runs"][0] and failed["cursor"] is None
    page = (await client.get("/v1/workflows/visible/runs", params={"limit": 1})).json()
    rest = (await client.get("/v1/workflows/visible/runs", params={"limit": 1, "cursor": page["cursor"]})).json()
    assert [r["id"] for r in page["runs"] + rest["runs"]] == ["bad", "ok"] and rest["cursor"] is None


async def test_a_record_whose_write_meets_an_unavailable_store_is_written_again_and_its_step_not_called_again(
        registry: App, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    cut = [1]
    apply = driven.apply

    async def cut_once(store: Any, machine: Any, change: driven.Change) -> Any:
        if cut[0] and any(isinstance(e, dict) and e.get("wf") == "step" for e in change.events):
            cut[0] -= 1
            raise ConnectionResetError("the store restarted")  # what a cut connection raises
        return await apply(store, machine, change)

    monkeypatch.setattr(driven, "apply", cut_once)

    async def pay() -> str:
        calls.append("pay")
        return "paid"

    @registry.workflow("outage")
    async def outage(wf: Workflow, args: Any) -> Any:
        return await wf.step(pay)

    await start(client, "outage", "o1")
    run = await finished(client, "outage", "o1")
    assert run["status"] == "completed" and run["result"] == "paid" and cut == [0]
    assert calls == ["pay"]


async def test_a_run_handed_over_at_a_version_older_than_its_newest_record_does_not_call_that_step_again(
        registry: App, app: Any, client: httpx.AsyncClient, clock: ManualClock, settings: Settings) -> None:
    settings.workflows.keep_ms = 0  # nothing stays in memory: a hand-over replays
    calls: list[str] = []

    async def work(label: str) -> str:
        calls.append(label)
        return label

    @registry.workflow("handovers")
    async def handovers(wf: Workflow, args: Any) -> Any:
        first = await wf.step(work, "a", name="a")
        await wf.sleep(1000)
        second = await wf.step(work, "b", name="b")
        await wf.sleep(1000)
        return [first, second]

    await start(client, "handovers", "h1")
    await until_status(client, "handovers", "h1", "sleeping")
    runner = runner_of(app.state.context)
    stale = await driven.machine(runner.store, "handovers", "h1")
    assert stale is not None
    clock.advance(1000)
    for _ in range(400):
        run = await run_of(client, "handovers", "h1")
        if run["status"] == "sleeping" and len(run["steps"]) == 4:
            break
        await asyncio.sleep(0.05)
    # A lease taken before the last write reaches the runner late (a slow server's loop): the recorded step "b"
    # must not run again from the older history.
    await runner.drive(dataclasses.replace(stale, lease_token="an older lease"))
    clock.advance(1000)
    run = await finished(client, "handovers", "h1")
    assert run["result"] == ["a", "b"] and calls == ["a", "b"]
