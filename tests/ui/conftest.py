"""Dashboard test fixtures: short exchange deadlines, an in-process machine processor, tokens, and
helpers that put data in every face through the API (so events and alerts are the real ones)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from mainspring.app import App, Registration
from mainspring.config import Settings, load_settings
from mainspring.core.auth import create_token
from mainspring.machines.processor import Unprocessable
from mainspring.store import ManualClock, Store
from tests.conftest import eventually

COMMIT_TIMEOUT_MS = 20_000
NS = "orders"
MAILBOX = "/v1/exchange/mailboxes/mobile-a/db-1"


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 200, "sqlite_synchronous": "NORMAL"},
        exchange={"process_timeout_ms": 10_000, "commit_timeout_ms": COMMIT_TIMEOUT_MS, "watchdog_interval_ms": 50},
        auth={"cache_ms": 0},
    )


class OrdersProcessor:
    """An in-process processor: a call with args ``"break"`` is refused for good (the machine fails)."""

    def init(self, args: Any, machine: dict[str, Any]) -> Any:
        return {"events": [{"opened": args}], "aux_state": {"step": 1}}

    def call(self, args: Any, machine: dict[str, Any]) -> Any:
        if args == "break":
            raise Unprocessable("the order book is corrupt")
        return {"events": [{"called": args}], "response": "ok"}

    def repair(self, args: Any, machine: dict[str, Any]) -> Any:
        return {"events": [{"repaired": args}], "aux_state": {"step": 2}, "response": "fixed"}


@pytest.fixture
def processor(registry: App) -> OrdersProcessor:
    target = OrdersProcessor()
    registry.processors[NS] = Registration(target)
    return target


@pytest.fixture
async def tokens(app: Any, store: Store) -> dict[str, str]:
    """An ``admin``, a read-only ``ui`` and a ``queues:*`` token; the server is no longer open."""
    made = {}
    for name, scopes in (("admin", ["admin"]), ("ui", ["ui"]), ("worker", ["queues:*"])):
        _id, made[name] = await create_token(store, name, scopes)
    app.state.authenticator.invalidate()
    return made


async def login(client: httpx.AsyncClient, token: str) -> httpx.Response:
    return await client.post("/ui/login", data={"token": token, "next": "/ui/"})



def api(client: httpx.AsyncClient, token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def in_doubt_process(client: httpx.AsyncClient, clock: ManualClock, token: str | None = None, count: int = 2) -> tuple[str, list[str]]:
    """Store ``count`` messages, take them in a process that says ready and then goes silent, and let
    the watchdog turn it IN_DOUBT. Answers (process id, message ids)."""
    headers = api(client, token)
    ids = []
    for n in range(count):
        reply = await client.post(f"{MAILBOX}/messages", content=f"order {n}".encode(), headers=headers)
        assert reply.status_code == 201, reply.text
        ids.append(reply.json()["id"])
    reply = await client.post(f"{MAILBOX}/processes", json={"client_id": "erp-1", "message_ids": ids}, headers=headers)
    assert reply.status_code == 201, reply.text
    pid = reply.json()["id"]
    assert (await client.post(f"/v1/exchange/processes/{pid}/ready", json={}, headers=headers)).status_code == 200
    clock.advance(COMMIT_TIMEOUT_MS + 1)

    async def doubted() -> bool:
        body = (await client.get(f"/v1/exchange/processes/{pid}", headers=headers)).json()
        return body["state"] == "IN_DOUBT"

    await eventually(doubted)
    return pid, ids


async def failed_machine(client: httpx.AsyncClient, machine_id: str = "m1", token: str | None = None) -> None:
    headers = api(client, token)
    reply = await client.post(f"/v1/namespaces/{NS}/machines", json={"id": machine_id, "args": {"total": 12}}, headers=headers)
    assert reply.status_code == 201, reply.text
    reply = await client.post(f"/v1/namespaces/{NS}/machines/{machine_id}/call", json={"args": "break"}, headers=headers)
    assert reply.status_code == 502, reply.text
    body = (await client.get(f"/v1/namespaces/{NS}/machines/{machine_id}", headers=headers)).json()
    assert body["status"] == "failed"


async def interaction_tree(client: httpx.AsyncClient, token: str | None = None) -> tuple[str, str]:
    """A parent with one child in queue ``mail``; answers (parent id, child id)."""
    headers = api(client, token)
    parent = await client.post("/v1/queues/mail/interactions", json={"data": {"to": "ann"}, "name": "thread"}, headers=headers)
    assert parent.status_code == 201, parent.text
    child = await client.post(
        "/v1/queues/mail/interactions",
        json={"data": {"part": 1}, "name": "reply", "parent_id": parent.json()["id"], "process_in_ms": 60_000},
        headers=headers,
    )
    assert child.status_code == 201, child.text
    return parent.json()["id"], child.json()["id"]


async def batch_tasks(client: httpx.AsyncClient, token: str | None = None) -> None:
    """Batcher ``loads`` with one package made of a complete pair, and one lone task still forming."""
    headers = api(client, token)
    reply = await client.put("/v1/batchers/loads", json={"min_size": 2, "max_size": 2, "linger_ms": 60_000, "max_wait_ms": 600_000, "group_size": 2}, headers=headers)
    assert reply.status_code == 200, reply.text
    for task_id, group, member in (("t1", "g1", "a"), ("t2", "g1", "b"), ("t3", "g2", "a")):
        reply = await client.post("/v1/batchers/loads/tasks", json={"id": task_id, "group": group, "member": member, "content": {"v": task_id}}, headers=headers)
        assert reply.status_code in (200, 202), reply.text

    async def packed() -> bool:
        body = (await client.get("/v1/batchers/loads/tasks/t1", headers=headers)).json()
        return body["status"] == "packed"

    await eventually(packed)
