"""Idempotency-Key on Start, Call, Notify and Repair, and the operations lookup."""

from __future__ import annotations

from typing import Any

import httpx

from mainspring.machines.processor import Unprocessable
from tests.machines.conftest import FakeProcessor
from tests.machines.test_seed_lifecycle import BASE, machine


async def test_repeated_start_with_the_same_key_gets_the_first_answer_and_changes_nothing(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    first = await client.post(BASE, json={"id": "m1", "args": 1}, headers={"Idempotency-Key": "k1"})
    again = await client.post(BASE, json={"id": "m1", "args": 1}, headers={"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json()
    assert fake.kinds() == ["init"]
    other = await client.post(BASE, json={"id": "m1", "args": 1}, headers={"Idempotency-Key": "k2"})
    assert other.status_code == 409


async def test_repeated_call_with_the_same_key_is_applied_once(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})
    replies = [await client.post(f"{BASE}/m1/call", json={"args": "pay"}, headers={"Idempotency-Key": "pay-1"}) for _ in range(3)]
    assert {r.status_code for r in replies} == {200}
    assert all(r.json() == {"response": {"echo": "pay"}} for r in replies)
    assert fake.kinds() == ["init", "call"]
    assert len((await machine(client, "m1"))["history"]) == 2
    operation = (await client.get(f"{BASE}/m1/operations/pay-1")).json()
    assert operation["kind"] == "call" and operation["status"] == 200 and operation["response"] == {"response": {"echo": "pay"}}


async def test_a_call_that_failed_the_machine_answers_the_same_failure_when_repeated(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})

    def refuse(a: Any, m: Any) -> Any:
        raise Unprocessable("never")

    fake.on("call", refuse)
    first = await client.post(f"{BASE}/m1/call", json={}, headers={"Idempotency-Key": "x"})
    again = await client.post(f"{BASE}/m1/call", json={}, headers={"Idempotency-Key": "x"})
    assert first.status_code == again.status_code == 502 and again.json()["code"] == "processor_refused"
    assert fake.kinds().count("call") == 1


async def test_a_transient_failure_leaves_no_operation_so_the_same_key_may_retry(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})

    def down(a: Any, m: Any) -> Any:
        raise ConnectionError("down")

    fake.on("call", down)
    assert (await client.post(f"{BASE}/m1/call", json={}, headers={"Idempotency-Key": "x"})).status_code == 502
    missing = await client.get(f"{BASE}/m1/operations/x")
    assert missing.status_code == 404 and missing.json()["code"] == "operation_not_found"
    fake.on("call", lambda a, m: {"response": "ok"})
    assert (await client.post(f"{BASE}/m1/call", json={}, headers={"Idempotency-Key": "x"})).json() == {"response": "ok"}


async def test_repeated_notify_with_the_same_key_queues_one_notification(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    fake.on("notification", lambda a, m: {"events": [a]})
    await client.post(BASE, json={"id": "m1"})
    ids = [(await client.post(f"{BASE}/m1/notifications", json={"args": "n"}, headers={"Idempotency-Key": "n1"})).json()["id"] for _ in range(3)]
    assert len(set(ids)) == 1
    assert (await client.get(f"{BASE}/m1/operations/n1")).json()["status"] == 202


async def test_a_key_used_for_another_kind_of_operation_is_409(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})
    await client.post(f"{BASE}/m1/call", json={}, headers={"Idempotency-Key": "same"})
    reply = await client.post(f"{BASE}/m1/notifications", json={}, headers={"Idempotency-Key": "same"})
    assert reply.status_code == 409 and reply.json()["code"] == "idempotency_key_reused"


async def test_repeated_repair_with_the_same_key_is_applied_once(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})

    def refuse(a: Any, m: Any) -> Any:
        raise Unprocessable("never")

    fake.on("call", refuse)
    await client.post(f"{BASE}/m1/call", json={})
    replies = [await client.post(f"{BASE}/m1/repair", json={"args": 1}, headers={"Idempotency-Key": "r"}) for _ in range(2)]
    assert [r.status_code for r in replies] == [200, 200]
    assert fake.kinds().count("repair") == 1
