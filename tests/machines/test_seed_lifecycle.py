"""Seed 001, «Стандартный жизненный цикл»: one test per sequence diagram, on both engines."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mainspring.machines.processor import Unprocessable
from mainspring.store import ManualClock
from tests.machines.conftest import NS, FakeProcessor, eventually

BASE = f"/v1/namespaces/{NS}/machines"


async def machine(client: httpx.AsyncClient, machine_id: str, **params: Any) -> dict[str, Any]:
    reply = await client.get(f"{BASE}/{machine_id}", params=params)
    assert reply.status_code == 200, reply.text
    return reply.json()


async def put_ns(client: httpx.AsyncClient, **retry: Any) -> None:
    policy = {"initial_ms": 1000, "factor": 2, "max_ms": 60_000, "max_attempts": 3, **retry}
    reply = await client.put(f"/v1/namespaces/{NS}", json={"processor": {"timeout_ms": 2000}, "retry": policy})
    assert reply.status_code == 200, reply.text


# Старт экземпляра процесса
async def test_start_saves_init_changes_and_schedules_the_action(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    fake.on("init", lambda args, m: {"events": [{"created": args}, "second"], "aux_state": {"step": 1}, "action": {"timer": {"in_ms": 5000}}})
    reply = await client.post(BASE, json={"id": "m1", "args": {"amount": 10}})
    assert reply.status_code == 201, reply.text
    body = reply.json()
    assert body["status"] == "working"
    assert [e["id"] for e in body["history"]] == [1, 2]
    assert body["history"][0]["data"] == {"created": {"amount": 10}}
    assert body["aux_state"] == {"step": 1}
    assert body["timer"] is not None
    assert fake.calls[0][0] == "init" and fake.calls[0][2]["history"] == []
    assert (await machine(client, "m1"))["history"] == body["history"]


# Старт экземпляра процесса - ошибка - уже существует
async def test_start_of_an_existing_machine_is_409_already_exists(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    assert (await client.post(BASE, json={"id": "m1"})).status_code == 201
    reply = await client.post(BASE, json={"id": "m1", "args": "again"})
    assert reply.status_code == 409
    assert reply.json()["code"] == "machine_already_exists"
    assert fake.kinds() == ["init"]  # existence is checked before the processor is asked
    assert len((await machine(client, "m1"))["history"]) == 1


async def test_start_in_an_unknown_namespace_is_404(client: httpx.AsyncClient) -> None:
    reply = await client.post("/v1/namespaces/nowhere/machines", json={"id": "m1"})
    assert reply.status_code == 404 and reply.json()["code"] == "namespace_not_found"


# Старт экземпляра процесса - ошибка процессора
async def test_start_with_processor_error_is_5xx_and_creates_nothing(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    def broken(args: Any, m: Any) -> Any:
        raise RuntimeError("database of the processor is down")

    fake.on("init", broken)
    reply = await client.post(BASE, json={"id": "m1"})
    assert reply.status_code == 502 and reply.json()["code"] == "processor_failed"
    fake.on("init", lambda a, m: (_ for _ in ()).throw(Unprocessable("bad args")))
    reply = await client.post(BASE, json={"id": "m1"})
    assert reply.status_code == 502 and reply.json()["code"] == "processor_refused" and reply.json()["detail"].endswith("bad args")
    assert (await client.get(f"{BASE}/m1")).json()["code"] == "machine_not_found"


# Срабатывание таймера
async def test_timer_fires_the_processor_timeout_into_history_once(client: httpx.AsyncClient, fake: FakeProcessor, clock: ManualClock) -> None:
    fake.on("init", lambda a, m: {"events": ["created"], "action": {"timer": {"in_ms": 1000}}})
    fake.on("timeout", lambda a, m: {"events": ["expired"], "aux_state": "done"})
    assert (await client.post(BASE, json={"id": "m1"})).status_code == 201
    clock.advance(999)
    assert fake.kinds() == ["init"]
    clock.advance(1)
    body = await eventually(lambda: _with_events(client, "m1", 2))
    assert [e["data"] for e in body["history"]] == ["created", "expired"]
    assert body["timer"] is None and body["aux_state"] == "done"
    clock.advance(10_000)
    assert fake.kinds() == ["init", "timeout"]
    timeout_call = fake.calls[1]
    assert timeout_call[2]["history"][0]["data"] == "created"


async def _with_events(client: httpx.AsyncClient, machine_id: str, count: int) -> dict[str, Any] | None:
    body = await machine(client, machine_id)
    return body if len(body["history"]) >= count else None


# Срабатывание таймера - ошибка процессора (обрабатываемая)
async def test_timer_with_transient_processor_error_is_retried_by_the_policy(
    client: httpx.AsyncClient, fake: FakeProcessor, clock: ManualClock
) -> None:
    await put_ns(client, max_attempts=5)
    failures = {"left": 2}

    def flaky(args: Any, m: Any) -> Any:
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("processor restarting")
        return {"events": ["expired"]}

    fake.on("init", lambda a, m: {"events": [], "action": {"timer": {"in_ms": 0}}})
    fake.on("timeout", flaky)
    assert (await client.post(BASE, json={"id": "m1"})).status_code == 201
    await eventually(lambda: _journal_len(client, "m1", 1))
    body = await machine(client, "m1")
    assert body["status"] == "working" and body["history"] == []
    assert body["failures"][0]["outcome"] == "retry" and body["failures"][0]["attempt"] == 1
    clock.advance(999)  # first retry after initial_ms = 1000
    assert fake.kinds().count("timeout") == 1
    clock.advance(1)
    await eventually(lambda: _journal_len(client, "m1", 2))
    clock.advance(2000)  # then factor 2
    body = await eventually(lambda: _with_events(client, "m1", 1))
    assert body["status"] == "working" and [e["data"] for e in body["history"]] == ["expired"]
    assert fake.kinds().count("timeout") == 3


async def _journal_len(client: httpx.AsyncClient, machine_id: str, count: int) -> bool:
    return len((await machine(client, machine_id))["failures"]) >= count


# Срабатывание таймера - ошибка процессора (необрабатываемая)
async def test_timer_with_permanent_processor_error_turns_the_machine_failed(
    client: httpx.AsyncClient, fake: FakeProcessor, clock: ManualClock
) -> None:
    def refuse(a: Any, m: Any) -> Any:
        raise Unprocessable("contract expired")

    fake.on("init", lambda a, m: {"action": {"timer": {"in_ms": 10}}})
    fake.on("timeout", refuse)
    await client.post(BASE, json={"id": "m1"})
    clock.advance(10)
    body = await eventually(lambda: _status(client, "m1", "failed"))
    assert body["error"]["code"] == "processor_refused" and body["error"]["permanent"] is True
    assert body["failures"][-1]["outcome"] == "failed"
    assert fake.kinds().count("timeout") == 1
    alerts = (await client.get("/v1/alerts", params={"open": "true"})).json()["alerts"]
    assert any(a["code"] == "machine_failed" and a["subject"]["id"] == f"{NS}/m1" for a in alerts)
    listed = (await client.get(BASE, params={"status": "failed"})).json()["machines"]
    assert [m["id"] for m in listed] == ["m1"]


async def _status(client: httpx.AsyncClient, machine_id: str, status: str) -> dict[str, Any] | None:
    body = await machine(client, machine_id)
    return body if body["status"] == status else None


# Вызов процесса
async def test_call_answers_the_processor_response_and_saves_its_changes(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1", "args": "hello"})
    fake.on("call", lambda a, m: {"events": [{"paid": a}], "aux_state": {"n": len(m["history"])}, "response": {"ok": True}})
    reply = await client.post(f"{BASE}/m1/call", json={"args": 42})
    assert reply.status_code == 200 and reply.json() == {"response": {"ok": True}}
    body = await machine(client, "m1")
    assert [e["id"] for e in body["history"]] == [1, 2]
    assert body["history"][1]["data"] == {"paid": 42} and body["aux_state"] == {"n": 1}
    assert fake.calls[-1][2]["history"][0]["data"] == {"started": "hello"}


# Вызов процесса - ошибка процессора (обрабатываемая)
async def test_call_with_transient_processor_error_is_5xx_and_the_machine_is_unchanged(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})
    before = await machine(client, "m1")

    def down(a: Any, m: Any) -> Any:
        raise OSError("connection refused")

    fake.on("call", down)
    reply = await client.post(f"{BASE}/m1/call", json={"args": 1})
    assert reply.status_code == 502 and reply.json()["code"] == "processor_failed"
    after = await machine(client, "m1")
    assert after["status"] == "working" and after["history"] == before["history"] and after["version"] == before["version"]
    assert after["failures"][-1]["outcome"] == "returned"


# Вызов процесса - ошибка процессора (необрабатываемая)
async def test_call_with_permanent_processor_error_is_5xx_and_the_machine_failed(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})

    def refuse(a: Any, m: Any) -> Any:
        raise Unprocessable("no such tariff")

    fake.on("call", refuse)
    reply = await client.post(f"{BASE}/m1/call", json={"args": 1})
    assert reply.status_code == 502 and reply.json()["code"] == "processor_refused"
    body = await machine(client, "m1")
    assert body["status"] == "failed" and body["error"]["detail"].endswith("no such tariff")
    assert body["error"]["code"] == "processor_refused" and body["failures"][-1]["code"] == "processor_refused"
    again = await client.post(f"{BASE}/m1/call", json={"args": 2})
    assert again.status_code == 409 and again.json()["code"] == "machine_failed"


# Запланировать нотификацию процесса
async def test_notify_is_accepted_and_saved_for_later_delivery(app: Any, client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})
    reply = await client.post(f"{BASE}/m1/notifications", json={"args": {"paid": 5}})
    assert reply.status_code == 202 and reply.json()["id"]
    body = await eventually(lambda: _with_events(client, "m1", 2))
    assert body["history"][1]["data"] == {"notified": {"paid": 5}}
    assert body["pending_notifications"] == 0


# Запланировать нотификацию процесса - ошибка получателя нотификации не существует
async def test_notify_of_a_missing_machine_is_404(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    reply = await client.post(f"{BASE}/ghost/notifications", json={"args": 1})
    assert reply.status_code == 404 and reply.json()["code"] == "machine_not_found"
    assert fake.calls == []


# Получение нотификации процессом
async def test_notifications_are_delivered_in_order_and_marked_delivered(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})
    for i in range(10):
        assert (await client.post(f"{BASE}/m1/notifications", json={"args": i})).status_code == 202
    body = await eventually(lambda: _with_events(client, "m1", 11))
    assert [e["data"] for e in body["history"][1:]] == [{"notified": i} for i in range(10)]
    assert body["pending_notifications"] == 0
    assert [c[1] for c in fake.calls if c[0] == "notification"] == list(range(10))


# Получение нотификации процессом - ошибка процессора (обрабатываемая)
async def test_notification_with_transient_processor_error_is_retried_in_order(
    client: httpx.AsyncClient, fake: FakeProcessor, clock: ManualClock
) -> None:
    await put_ns(client, max_attempts=5)
    await client.post(BASE, json={"id": "m1"})
    failures = {"left": 1}

    def flaky(args: Any, m: Any) -> Any:
        if failures["left"]:
            failures["left"] -= 1
            raise TimeoutError("slow processor")
        return {"events": [args]}

    fake.on("notification", flaky)
    await client.post(f"{BASE}/m1/notifications", json={"args": "first"})
    await client.post(f"{BASE}/m1/notifications", json={"args": "second"})
    await eventually(lambda: _journal_len(client, "m1", 1))
    body = await machine(client, "m1")
    assert body["pending_notifications"] == 2 and len(body["history"]) == 1
    clock.advance(1000)
    body = await eventually(lambda: _with_events(client, "m1", 3))
    assert [e["data"] for e in body["history"][1:]] == ["first", "second"]


# Получение нотификации процессом - ошибка процессора (необрабатываемая)
async def test_notification_with_permanent_processor_error_fails_the_machine_and_later_ones_wait_for_repair(
    client: httpx.AsyncClient, fake: FakeProcessor
) -> None:
    await client.post(BASE, json={"id": "m1"})

    def refuse(a: Any, m: Any) -> Any:
        if a == "poison":
            raise Unprocessable("cannot apply")
        return {"events": [a]}

    fake.on("notification", refuse)
    await client.post(f"{BASE}/m1/notifications", json={"args": "poison"})
    body = await eventually(lambda: _status(client, "m1", "failed"))
    await client.post(f"{BASE}/m1/notifications", json={"args": "after"})
    body = await machine(client, "m1")
    assert body["pending_notifications"] == 2 and len(body["history"]) == 1
    fake.on("notification", lambda a, m: {"events": [a]})
    reply = await client.post(f"{BASE}/m1/repair", json={"simple": True})
    assert reply.status_code == 200
    body = await eventually(lambda: _with_events(client, "m1", 3))
    assert [e["data"] for e in body["history"][1:]] == ["poison", "after"]


# Получение history процесса
async def test_get_answers_the_history_in_the_requested_range(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    fake.on("init", lambda a, m: {"events": list(range(1, 11))})
    await client.post(BASE, json={"id": "m1"})
    assert [e["id"] for e in (await machine(client, "m1"))["history"]] == list(range(1, 11))
    assert [e["id"] for e in (await machine(client, "m1", after=3, limit=4))["history"]] == [4, 5, 6, 7]
    assert [e["id"] for e in (await machine(client, "m1", direction="backward", limit=3))["history"]] == [10, 9, 8]
    assert [e["id"] for e in (await machine(client, "m1", direction="backward", after=3))["history"]] == [2, 1]
    bad = await client.get(f"{BASE}/m1", params={"direction": "sideways"})
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_request"


# Получение history процесса - ошибка - нет данных
async def test_get_of_a_missing_machine_is_404(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    reply = await client.get(f"{BASE}/ghost")
    assert reply.status_code == 404 and reply.json()["code"] == "machine_not_found"


# Удаление history процесса
async def test_remove_deletes_the_machine_with_its_history(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await client.post(BASE, json={"id": "m1"})
    await client.post(f"{BASE}/m1/notifications", json={"args": 1})
    assert (await client.delete(f"{BASE}/m1")).status_code == 204
    assert (await client.get(f"{BASE}/m1")).status_code == 404

    async def removed_events() -> list[Any]:
        return (await client.get("/v1/events", params={"types": "machine.removed"})).json()["events"]

    events = await eventually(removed_events)  # PostgreSQL numbers events a moment after commit
    assert [e["subject"]["id"] for e in events] == [f"{NS}/m1"]
    assert (await client.post(BASE, json={"id": "m1"})).status_code == 201
    assert [e["id"] for e in (await machine(client, "m1"))["history"]] == [1]


# Удаление history процесса - ошибка - нет данных
async def test_remove_of_a_missing_machine_is_404(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    reply = await client.delete(f"{BASE}/ghost")
    assert reply.status_code == 404 and reply.json()["code"] == "machine_not_found"


async def test_a_processor_failure_answers_502_without_what_the_processor_raised(
        client: httpx.AsyncClient, fake: FakeProcessor, caplog: pytest.LogCaptureFixture) -> None:
    def broken(args: Any, m: Any) -> Any:
        raise RuntimeError("password=hunter2 at db.internal:5432")

    fake.on("init", broken)
    reply = await client.post(BASE, json={"id": "m1"})
    assert reply.status_code == 502 and reply.json()["code"] == "processor_failed"
    assert "hunter2" not in reply.text and "db.internal" not in reply.text
    assert "hunter2" in caplog.text  # the operator still sees it


def test_a_machine_subject_names_its_machine_back_and_a_hashed_one_none() -> None:
    """Events and alerts carry a machine as one subject; the dashboard and the alerts' closing read it back."""
    from mainspring.machines.data import machine_subject, subject_machine

    for namespace, machine_id in (("ns", "m1"), ("a/b", "c/d#e"), ("ns", "%2F")):
        assert subject_machine(machine_subject(namespace, machine_id)) == (namespace, machine_id)
    assert subject_machine(machine_subject("ns", "x" * 1000)) is None
    assert subject_machine("ns") is None and subject_machine("a/b/c") is None
