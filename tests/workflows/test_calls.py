"""What each recorded call of a workflow does (API.md §5's first table), on both engines."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from mainspring import App, ChildFailed, Complete, Fail, Interaction, StepFailed, TaskFailed, Workflow
from mainspring.config import Settings
from mainspring.machines import data as machines_data
from mainspring.store import ManualClock
from tests.workflows.conftest import finished, run_of, until_status


@pytest.fixture
def registry() -> App:
    """Queues must be registered before the server starts (their workers start with it)."""
    app = App()

    @app.queue("shipping")
    async def ship(item: Interaction) -> Any:
        if item.data.get("sku") == "broken":
            return Fail("no such parcel")
        return Complete({"shipped": item.data["sku"]})

    @app.queue("manual")
    async def never(item: Interaction) -> Any:
        await asyncio.sleep(3600)  # until its interaction is cancelled

    return app


async def start(client: httpx.AsyncClient, name: str, run_id: str, args: Any = None) -> dict[str, Any]:
    answer = await client.post(f"/v1/workflows/{name}/runs", json={"id": run_id, "args": args})
    assert answer.status_code in (200, 201), answer.text
    return answer.json()  # type: ignore[no-any-return]


async def test_a_sleep_is_a_machine_timer_and_the_run_sleeps_until_it_fires(registry: App, client: httpx.AsyncClient, clock: ManualClock) -> None:
    @registry.workflow("naps")
    async def nap(wf: Workflow, args: Any) -> str:
        await wf.sleep(60_000)
        return "rested"

    await start(client, "naps", "n1")
    run = await until_status(client, "naps", "n1", "sleeping")
    machine = (await client.get("/v1/namespaces/naps/machines/n1")).json()
    assert machine["timer"] is not None and machine["timer"] == run["waiting_for"]["until"]
    clock.advance(60_000)
    run = await finished(client, "naps", "n1")
    assert run["status"] == "completed" and run["result"] == "rested"
    assert [(s["kind"], s["result"]) for s in run["steps"]] == [("sleep", None)]


async def test_signals_sent_before_a_wait_are_kept_and_taken_in_order(registry: App, client: httpx.AsyncClient, clock: ManualClock) -> None:
    @registry.workflow("approvals")
    async def approval(wf: Workflow, args: Any) -> list[Any]:
        await wf.sleep(1000)
        return [await wf.wait("vote"), await wf.wait("vote"), await wf.wait("other")]

    await start(client, "approvals", "a1")
    await until_status(client, "approvals", "a1", "sleeping")
    for payload in ({"by": "ann"}, {"by": "bob"}):
        assert (await client.post("/v1/workflows/approvals/runs/a1/signals/vote", json={"payload": payload})).status_code == 202
    clock.advance(1000)
    run = await until_status(client, "approvals", "a1", "waiting")
    assert run["waiting_for"] == {"signal": "other"}
    assert (await client.post("/v1/workflows/approvals/runs/a1/signals/other", json={})).status_code == 202
    run = await finished(client, "approvals", "a1")
    assert run["result"] == [{"by": "ann"}, {"by": "bob"}, None]
    assert [(s["kind"], s["name"]) for s in run["steps"] if s["kind"] in ("signal", "wait")] == [
        ("signal", "vote"), ("signal", "vote"), ("wait", "vote"), ("wait", "vote"), ("wait", "other"), ("signal", "other")]


async def test_a_wait_that_gets_no_signal_raises_the_builtin_TimeoutError(registry: App, client: httpx.AsyncClient, clock: ManualClock) -> None:
    @registry.workflow("patience")
    async def patience(wf: Workflow, args: Any) -> str:
        try:
            return str(await wf.wait("approved", timeout_ms=5000))
        except TimeoutError:
            return "timed out"

    await start(client, "patience", "p1")
    run = await until_status(client, "patience", "p1", "waiting")
    assert run["waiting_for"] == {"signal": "approved"}
    clock.advance(5000)
    run = await finished(client, "patience", "p1")
    assert run["result"] == "timed out"
    assert run["steps"][0]["error"]["type"] == "TimeoutError"


async def test_start_is_idempotent_by_id_whatever_the_status(registry: App, client: httpx.AsyncClient) -> None:
    ran: list[Any] = []

    @registry.workflow("once")
    async def once(wf: Workflow, args: Any) -> Any:
        ran.append(args)
        return args

    first = await client.post("/v1/workflows/once/runs", json={"id": "x", "args": 1})
    assert first.status_code == 201
    await finished(client, "once", "x")
    again = await client.post("/v1/workflows/once/runs", json={"id": "x", "args": 2})
    assert again.status_code == 200 and again.json()["args"] == 1 and again.json()["status"] == "completed"
    assert ran == [1]
    generated = await client.post("/v1/workflows/once/runs", json={})
    assert generated.status_code == 201 and len(generated.json()["id"]) == 36


async def test_unknown_workflows_and_runs_are_404_and_a_finished_run_refuses_signals(registry: App, client: httpx.AsyncClient) -> None:
    @registry.workflow("quick")
    async def quick(wf: Workflow, args: Any) -> int:
        return 1

    assert (await client.post("/v1/workflows/nope/runs", json={})).json()["code"] == "workflow_not_found"
    assert (await client.get("/v1/workflows/quick/runs/missing")).json()["code"] == "run_not_found"
    assert (await client.post("/v1/workflows/quick/runs/missing/signals/s", json={})).json()["code"] == "run_not_found"
    await start(client, "quick", "q")
    await finished(client, "quick", "q")
    refused = await client.post("/v1/workflows/quick/runs/q/signals/s", json={})
    assert refused.status_code == 409 and refused.json()["code"] == "run_finished"
    assert (await client.post("/v1/workflows/quick/runs/q/cancel")).json()["code"] == "run_finished"
    assert (await client.post("/v1/workflows/quick/runs/q/retry")).json()["code"] == "run_not_failed"


async def test_a_failing_step_is_called_again_with_backoff_then_raises_StepFailed(registry: App, client: httpx.AsyncClient, clock: ManualClock) -> None:
    attempts: list[int] = []
    keys: list[str] = []

    @registry.workflow("flaky")
    async def flaky(wf: Workflow, args: Any) -> Any:
        def charge() -> None:
            attempts.append(clock.now_ms())
            keys.append(wf.key)
            raise ConnectionError("card service down")

        try:
            await wf.step(charge, max_attempts=3, backoff_ms=1000)
        except StepFailed as failed:
            return {"type": failed.type, "message": failed.message}
        return None

    await start(client, "flaky", "f1")
    for _ in range(100):
        if len(attempts) == 3:
            break
        await asyncio.sleep(0.05)
        clock.advance(500)
    run = await finished(client, "flaky", "f1")
    assert run["result"] == {"type": "ConnectionError", "message": "card service down"}
    assert attempts[1] - attempts[0] >= 1000 and attempts[2] - attempts[1] >= 2000
    assert keys == ["wf:flaky:f1:1"] * 3
    assert run["steps"][0]["error"] == {"type": "ConnectionError", "message": "card service down"}


async def test_gathered_steps_run_concurrently_and_each_is_recorded(registry: App, client: httpx.AsyncClient) -> None:
    a_started, b_started = asyncio.Event(), asyncio.Event()

    async def a() -> str:
        a_started.set()
        await asyncio.wait_for(b_started.wait(), 10)  # only returns when b runs at the same time
        return "a"

    async def b() -> str:
        b_started.set()
        await asyncio.wait_for(a_started.wait(), 10)
        return "b"

    @registry.workflow("fanout")
    async def fanout(wf: Workflow, args: Any) -> list[str]:
        return list(await asyncio.gather(wf.step(a), wf.step(b)))

    await start(client, "fanout", "g1")
    run = await finished(client, "fanout", "g1")
    assert run["result"] == ["a", "b"]
    assert sorted((s["n"], s["name"]) for s in run["steps"]) == [(1, "a"), (2, "b")]


async def test_a_task_is_an_interaction_of_its_queue_and_its_result_or_failure_comes_back(registry: App, client: httpx.AsyncClient) -> None:
    @registry.workflow("shipments")
    async def shipment(wf: Workflow, args: Any) -> Any:
        try:
            return await wf.task("shipping", {"sku": args}, priority=5, user="u1")
        except TaskFailed as failed:
            return {"failed": failed.error}

    await start(client, "shipments", "s1", "A-1")
    await start(client, "shipments", "s2", "broken")
    ok, bad = await finished(client, "shipments", "s1"), await finished(client, "shipments", "s2")
    assert ok["result"] == {"shipped": "A-1"} and bad["result"] == {"failed": "no such parcel"}
    item_id = ok["steps"][0]["task"]
    item = (await client.get(f"/v1/interactions/{item_id}")).json()
    assert item["message_id"] == "wf:shipments:s1:1" and item["priority"] == 5 and item["user"] == "u1"


async def test_a_child_is_started_or_joined_and_its_failure_is_ChildFailed(registry: App, client: httpx.AsyncClient) -> None:
    @registry.workflow("kid")
    async def kid(wf: Workflow, args: Any) -> Any:
        if args == "bad":
            raise ValueError("kid broke")
        return f"kid {args}"

    @registry.workflow("parent")
    async def parent(wf: Workflow, args: Any) -> Any:
        first = await wf.child("kid", "k1", "one")
        joined = await wf.child("kid", "k1", "ignored: it exists")
        try:
            await wf.child("kid", "k2", "bad")
        except ChildFailed as failed:
            return [first, joined, failed.type, failed.message]
        return None

    await start(client, "parent", "p")
    run = await finished(client, "parent", "p")
    assert run["result"] == ["kid one", "kid one", "ValueError", "kid broke"], run
    assert (await run_of(client, "kid", "k2"))["status"] == "failed"


async def test_now_and_uuid_are_recorded_once_and_the_same_on_replay(registry: App, client: httpx.AsyncClient, clock: ManualClock,
                                                                     settings: Settings) -> None:
    settings.workflows.keep_ms = 0  # every wake replays

    @registry.workflow("stamps")
    async def stamps(wf: Workflow, args: Any) -> Any:
        first = (wf.now(), wf.uuid())
        await wf.sleep(1000)
        return [*first, wf.now()]

    await start(client, "stamps", "t1")
    await until_status(client, "stamps", "t1", "sleeping")
    started_at = clock.now_ms()
    clock.advance(1000)
    run = await finished(client, "stamps", "t1")
    now, uid, later = run["result"]
    assert now == started_at and later == started_at + 1000 and len(uid) == 36
    assert [(s["kind"], s["result"]) for s in run["steps"] if s["kind"] in ("now", "uuid")] == [("now", now), ("uuid", uid), ("now", later)]


async def test_a_run_knows_its_id_name_and_args(registry: App, client: httpx.AsyncClient) -> None:
    @registry.workflow("selves")
    async def selves(wf: Workflow, args: Any) -> Any:
        return [wf.id, wf.name, wf.args]

    await start(client, "selves", "me", {"k": [1, 2]})
    assert (await finished(client, "selves", "me"))["result"] == ["me", "selves", {"k": [1, 2]}]


async def test_a_read_with_wait_ms_answers_when_the_run_finishes_or_the_wait_ends(registry: App, client: httpx.AsyncClient,
                                                                                  clock: ManualClock) -> None:
    @registry.workflow("slow")
    async def slow(wf: Workflow, args: Any) -> str:
        await wf.sleep(1000)
        return "done"

    await start(client, "slow", "w1")
    await until_status(client, "slow", "w1", "sleeping")
    unfinished = await client.get("/v1/workflows/slow/runs/w1", params={"wait_ms": 100})
    assert unfinished.status_code == 200 and unfinished.json()["status"] == "sleeping"
    waiting = asyncio.create_task(client.get("/v1/workflows/slow/runs/w1", params={"wait_ms": 20_000}))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    clock.advance(1000)
    answer = await asyncio.wait_for(waiting, 20)
    assert answer.json()["status"] == "completed" and answer.json()["result"] == "done"
    assert (await client.get("/v1/workflows/slow/runs/w1", params={"wait_ms": 60_001})).status_code == 422


async def test_a_cancelled_task_or_child_is_TaskFailed_or_ChildFailed_in_its_parent(registry: App, client: httpx.AsyncClient) -> None:
    @registry.workflow("idle")
    async def idle(wf: Workflow, args: Any) -> Any:
        return await wf.wait("never")

    @registry.workflow("boss")
    async def boss(wf: Workflow, args: Any) -> Any:
        found = []
        try:
            await wf.task("manual", {"x": 1}, source="erp", channel="web")
        except TaskFailed as failed:
            found.append(["task", failed.error])
        try:
            await wf.child("idle", "i1")
        except ChildFailed as failed:
            found.append(["child", failed.type])
        return found

    await start(client, "boss", "b1")
    run = await until_status(client, "boss", "b1", "waiting")
    item = (await client.get(f"/v1/interactions/{run['waiting_for']['task']}")).json()
    assert item["source"] == "erp" and item["channel"] == "web"
    assert (await client.post(f"/v1/interactions/{item['id']}/cancel")).status_code == 200
    for _ in range(400):  # the child exists once the task's end woke its parent
        if (await client.get("/v1/workflows/idle/runs/i1")).status_code == 200:
            break
        await asyncio.sleep(0.05)
    await until_status(client, "idle", "i1", "waiting")
    assert (await client.post("/v1/workflows/idle/runs/i1/cancel")).status_code == 200
    run = await finished(client, "boss", "b1")
    assert run["status"] == "completed", run
    (task, task_error), (child, child_type) = run["result"]
    assert (task, child) == ("task", "child") and task_error and child_type


async def test_a_cancelled_run_cancels_its_unfinished_task(registry: App, client: httpx.AsyncClient) -> None:
    @registry.workflow("tasked")
    async def tasked(wf: Workflow, args: Any) -> Any:
        return await wf.task("manual", {"x": 1})

    await start(client, "tasked", "t1")
    run = await until_status(client, "tasked", "t1", "waiting")
    item_id = run["waiting_for"]["task"]
    assert (await client.post("/v1/workflows/tasked/runs/t1/cancel")).status_code == 200
    for _ in range(400):
        item = (await client.get(f"/v1/interactions/{item_id}")).json()
        if item["status"] == "cancelled":
            break
        await asyncio.sleep(0.05)
    assert item["status"] == "cancelled"


async def test_runs_woken_together_read_their_pending_signals_in_one_query_each_getting_its_own_in_order(
        registry: App, client: httpx.AsyncClient, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    read_at_once: list[int] = []
    many = machines_data.notifications_of_many

    async def counted(conn: Any, uids: Any, limit: int) -> Any:
        read_at_once.append(len(uids))
        return await many(conn, uids, limit)

    monkeypatch.setattr(machines_data, "notifications_of_many", counted)

    @registry.workflow("choirs")
    async def choir(wf: Workflow, args: Any) -> list[Any]:
        await wf.sleep(1000)
        return [await wf.wait("note"), await wf.wait("note")]

    ids = [f"c{i}" for i in range(4)]
    for run_id in ids:
        await start(client, "choirs", run_id)
    for run_id in ids:
        await until_status(client, "choirs", run_id, "sleeping")
        for note in ("do", "re"):
            assert (await client.post(f"/v1/workflows/choirs/runs/{run_id}/signals/note", json={"payload": f"{run_id}-{note}"})).status_code == 202
    read_at_once.clear()
    clock.advance(1000)
    for run_id in ids:
        run = await finished(client, "choirs", run_id)
        assert run["result"] == [f"{run_id}-do", f"{run_id}-re"]
    assert max(read_at_once) > 1
