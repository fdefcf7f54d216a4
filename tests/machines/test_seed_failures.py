"""Seed 001, «Сбои и восстановление процессов»: the failure and recovery notes, on both engines."""

from __future__ import annotations

from typing import Any

import httpx

from mainspring.machines.processor import Unprocessable
from mainspring.store import ManualClock
from tests.machines.conftest import NS, FakeProcessor, eventually
from tests.machines.test_seed_lifecycle import BASE, _status, machine, put_ns


def refuse(args: Any, machine: Any) -> Any:
    raise Unprocessable("cannot")


def crash(args: Any, machine: Any) -> Any:
    raise ConnectionError("processor down")


# Обрабатываемый (временный) сбой + Восстановление после обрабатываемого сбоя (with retry policy):
# a transient failure is "timer = the next step of the retry strategy"; a spent strategy fails the machine.
async def test_spent_retry_policy_fails_the_machine_raises_an_alert_and_journals_every_attempt(
    client: httpx.AsyncClient, fake: FakeProcessor, clock: ManualClock
) -> None:
    await put_ns(client, initial_ms=100, factor=3, max_attempts=3)
    fake.on("init", lambda a, m: {"action": {"timer": {"in_ms": 0}}})
    fake.on("timeout", crash)
    await client.post(BASE, json={"id": "m1"})
    await eventually(lambda: _journal(client, 1))
    clock.advance(100)
    await eventually(lambda: _journal(client, 2))
    clock.advance(300)
    body = await eventually(lambda: _status(client, "m1", "failed"))
    assert [f["outcome"] for f in body["failures"]] == ["retry", "retry", "failed"]
    assert [f["attempt"] for f in body["failures"]] == [1, 2, 3]
    assert body["error"]["permanent"] is False
    alerts = (await client.get("/v1/alerts", params={"open": "true"})).json()["alerts"]
    assert [a["code"] for a in alerts if a["subject"]["id"] == f"{NS}/m1"] == ["machine_failed"]


async def test_retry_policy_max_total_ms_bounds_the_time_spent_retrying(client: httpx.AsyncClient, fake: FakeProcessor, clock: ManualClock) -> None:
    await put_ns(client, initial_ms=1000, factor=1, max_attempts=None, max_total_ms=2500)
    fake.on("init", lambda a, m: {"action": {"timer": {"in_ms": 0}}})
    fake.on("timeout", crash)
    await client.post(BASE, json={"id": "m1"})
    for count in (1, 2, 3):
        await eventually(lambda count=count: _journal(client, count))
        clock.advance(1000)
    body = await eventually(lambda: _status(client, "m1", "failed"))
    assert [f["outcome"] for f in body["failures"]][-1] == "failed"


async def _journal(client: httpx.AsyncClient, count: int) -> bool:
    return len((await machine(client, "m1"))["failures"]) >= count


# Необрабатываемый сбой в работе процесса → FAILED; Восстановление (repairing) — like a call, success → working
async def test_repair_through_the_processor_returns_its_response_and_the_machine_works_again(
    client: httpx.AsyncClient, fake: FakeProcessor
) -> None:
    await client.post(BASE, json={"id": "m1"})
    fake.on("call", refuse)
    assert (await client.post(f"{BASE}/m1/call", json={"args": 1})).status_code == 502
    fake.on("repair", lambda a, m: {"events": [{"fixed": a}], "aux_state": "repaired", "response": {"ok": a}})
    reply = await client.post(f"{BASE}/m1/repair", json={"args": "patch"})
    assert reply.status_code == 200 and reply.json() == {"response": {"ok": "patch"}}
    body = await machine(client, "m1")
    assert body["status"] == "working" and body["error"] is None and body["aux_state"] == "repaired"
    assert body["history"][-1]["data"] == {"fixed": "patch"}
    assert [f["outcome"] for f in body["failures"]] == ["failed", "repaired"]
    fake.on("call", lambda a, m: {"response": "fine"})
    assert (await client.post(f"{BASE}/m1/call", json={})).json() == {"response": "fine"}


async def test_the_repaired_event_says_whether_the_processor_repaired_the_machine(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    fake.on("call", refuse)
    fake.on("repair", lambda a, m: {"response": "ok"})
    for machine_id, repair in (("by-processor", {"args": "patch"}), ("simply", {"simple": True})):
        await client.post(BASE, json={"id": machine_id})
        await client.post(f"{BASE}/{machine_id}/call", json={"args": 1})
        assert (await client.post(f"{BASE}/{machine_id}/repair", json=repair)).status_code == 200

    async def repaired() -> list[Any] | None:
        events = (await client.get("/v1/events", params={"types": "machine.repaired"})).json()["events"]
        return events if len(events) >= 2 else None

    events = await eventually(repaired)
    assert {e["data"]["id"]: e["data"]["simple"] for e in events} == {"by-processor": False, "simply": True}


async def test_repair_of_a_working_machine_is_409_already_working(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})
    for body in ({"args": 1}, {"simple": True}):
        reply = await client.post(f"{BASE}/m1/repair", json=body)
        assert reply.status_code == 409 and reply.json()["code"] == "machine_already_working"
    assert "repair" not in fake.kinds()


async def test_repair_that_fails_again_keeps_the_machine_failed_and_journals_the_attempt(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})
    fake.on("call", refuse)
    await client.post(f"{BASE}/m1/call", json={"args": 1})
    fake.on("repair", crash)
    reply = await client.post(f"{BASE}/m1/repair", json={})
    assert reply.status_code == 502 and reply.json()["code"] == "processor_failed"
    fake.on("repair", refuse)
    reply = await client.post(f"{BASE}/m1/repair", json={})
    assert reply.status_code == 502 and reply.json()["code"] == "processor_refused"
    body = await machine(client, "m1")
    assert body["status"] == "failed"
    assert [f["outcome"] for f in body["failures"]] == ["failed", "repair_failed", "repair_failed"]


async def test_simple_repair_marks_the_machine_working_without_the_processor(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})
    fake.on("call", refuse)
    await client.post(f"{BASE}/m1/call", json={"args": 1})
    reply = await client.post(f"{BASE}/m1/repair", json={"simple": True})
    assert reply.status_code == 200
    body = await machine(client, "m1")
    assert body["status"] == "working" and "repair" not in fake.kinds()


async def test_a_timer_that_failed_the_machine_fires_again_after_repair(client: httpx.AsyncClient, fake: FakeProcessor, clock: ManualClock) -> None:
    fake.on("init", lambda a, m: {"action": {"timer": {"in_ms": 10}}})
    fake.on("timeout", refuse)
    await client.post(BASE, json={"id": "m1"})
    clock.advance(10)
    await eventually(lambda: _status(client, "m1", "failed"))
    fake.on("timeout", lambda a, m: {"events": ["expired"]})
    await client.post(f"{BASE}/m1/repair", json={"simple": True})
    body = await eventually(lambda: _events(client, 1))
    assert body["history"][0]["data"] == "expired" and body["timer"] is None


async def _events(client: httpx.AsyncClient, count: int) -> dict[str, Any] | None:
    body = await machine(client, "m1")
    return body if len(body["history"]) >= count else None


async def test_processor_remove_action_removes_the_machine(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})
    fake.on("call", lambda a, m: {"events": ["closed"], "action": {"remove": True}, "response": "bye"})
    assert (await client.post(f"{BASE}/m1/call", json={})).json() == {"response": "bye"}
    assert (await client.get(f"{BASE}/m1")).json()["code"] == "machine_not_found"


async def test_events_of_a_machine_are_on_the_outbox_in_order(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})
    await client.post(f"{BASE}/m1/call", json={"args": 1})
    fake.on("call", refuse)
    await client.post(f"{BASE}/m1/call", json={"args": 2})
    await client.post(f"{BASE}/m1/repair", json={"simple": True})
    await client.delete(f"{BASE}/m1")

    async def machine_events() -> list[Any]:
        events = (await client.get("/v1/events", params={"types": "machine.*"})).json()["events"]
        return events if len(events) >= 6 else []

    events = await eventually(machine_events)
    assert [e["type"] for e in events] == ["machine.created", "machine.event", "machine.event", "machine.failed", "machine.repaired", "machine.removed"]
    assert [e["data"].get("event_id") for e in events[1:3]] == [1, 2]
