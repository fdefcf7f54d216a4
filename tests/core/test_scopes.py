"""Every /v1 operation in the OpenAPI document refuses a token whose scopes name other addressees,
namespaces, queues and batchers — read or write, by name or by id — and changes nothing; and no token, right
or wrong, ever reaches the log."""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from mainspring.config import Settings, load_settings
from mainspring.core import auth, outbox
from mainspring.store import Store

TOKENS = {
    "boss": ["admin"],
    "stranger": ["queues:other", "machines:other", "batchers:other", "exchange:send:other", "exchange:receive:other", "workflows:other"],
}

# An operation a stranger may call: it answers only what the caller's own scopes cover.
OWN_VIEW = {("get", "/v1/exchange/mailboxes"), ("get", "/v1/periodic")}

# Valid bodies where the scope is known only once the object is read (so the body is validated first).
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/interactions/{interaction_id}/fail"): {"error": "boom"},
    ("post", "/v1/interactions/{interaction_id}/schedule"): {"process_in_ms": 1000},
    ("post", "/v1/interactions/{interaction_id}/heartbeat"): {"token": "x"},
    ("post", "/v1/interactions/{interaction_id}/release"): {"token": "x", "outcome": {"complete": {}}},
    ("post", "/v1/packages/{package_id}/complete"): {"token": "x"},
    ("post", "/v1/packages/{package_id}/fail"): {"token": "x", "error": "boom"},
    ("post", "/v1/packages/{package_id}/heartbeat"): {"token": "x"},
    ("put", "/v1/periodic/{name}"): {"cron": "* * * * *", "queue": "q"},
}

# Machinegun's Automaton multiplexes every machine behind one URL: the namespace is in the Thrift message, so
# the stranger sends a real call for another namespace and is refused the woody way (403, woody headers).
THRIFT = ("post", "/v1/machinegun/automaton")
THRIFT_SINK = ("post", "/v1/machinegun/event_sink")


async def thrift_get_machine(client: httpx.AsyncClient, url: str, ns: str, machine_id: str) -> httpx.Response:
    from mainspring.machines.machinegun import woody
    from mainspring.machines.machinegun.idl import Automaton, EventSink, stateproc
    from tests.machines.machinegun import desc

    headers = {"content-type": woody.CONTENT_TYPE, **woody.root_trace().child().headers(), **as_("stranger")}
    if url.endswith("event_sink"):
        call = woody.encode_call(EventSink, "GetHistory", {"event_sink_id": ns, "range": stateproc.HistoryRange()})
    else:
        call = woody.encode_call(Automaton, "GetMachine", {"desc": desc(ns, machine_id)})
    return await client.post(url, content=call, headers=headers)


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 200},
        auth={"cache_ms": 0, "tokens": [{"token_sha256": hashlib.sha256(name.encode()).hexdigest(), "scopes": scopes, "name": name}
                         for name, scopes in TOKENS.items()]},
    )


def as_(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {name}"}


async def existing_objects(client: httpx.AsyncClient) -> dict[str, str]:
    """One real object of each kind the stranger will aim at, made by the admin."""
    boss = as_("boss")
    stored = await client.post("/v1/exchange/mailboxes/erp/db1/messages", content=b'{"n": 1}', headers=boss)
    assert stored.status_code == 201, stored.text
    process = await client.post("/v1/exchange/mailboxes/erp/db1/processes", json={"client_id": "c1", "message_ids": [stored.json()["id"]]}, headers=boss)
    assert process.status_code == 201, process.text
    item = await client.post("/v1/queues/q/interactions", json={"message_id": "m1"}, headers=boss)
    assert item.status_code == 201, item.text
    batcher = await client.put("/v1/batchers/b", json={"min_size": 1, "max_size": 1, "group_size": 1}, headers=boss)
    assert batcher.status_code == 200, batcher.text
    task = await client.post("/v1/batchers/b/tasks", json={"id": "t1", "group": "g", "member": "m", "content": "x"}, headers=boss)
    assert task.status_code == 202, task.text
    schedule = await client.put("/v1/periodic/b", json={"cron": "*/5 * * * *", "queue": "q"}, headers=boss)
    assert schedule.status_code == 200, schedule.text
    package = await client.post("/v1/batchers/b/packages/claim", json={"worker": "w", "wait_ms": 5000}, headers=boss)
    assert package.status_code == 200, package.text
    return {
        "addressee": "erp", "database": "db1", "message_id": stored.json()["id"],
        "process_id": process.json()["id"],
        "ns": "ns1", "id": "m1", "key": "k1",
        "queue": "q", "interaction_id": str(item.json()["id"]),
        "name": "b", "task_id": "t1", "group": "g", "member": "m", "package_id": str(package.json()["id"]),
        "alert_id": "1", "signal": "s1",
    }


async def event_count(client: httpx.AsyncClient, store: Store) -> int:
    await outbox.wait_numbered(store)
    answer = await client.get("/v1/events", params={"limit": 1000}, headers=as_("boss"))
    return len(answer.json()["events"])


# Ids of the same kinds that name nothing.
UNKNOWN = {"interaction_id": "987654321", "process_id": "p0123456789", "package_id": "pkg_0123456789", "name": "nosuch"}


def owned(operation: dict[str, Any]) -> str | None:
    """The path parameter whose object names the operation's scope (its permission loads it), if any."""
    if "<the" not in operation["x-mainspring-permission"]:
        return None
    return next(p["name"] for p in operation["parameters"] if p["in"] == "path" and p["name"] in UNKNOWN)


async def test_every_v1_operation_refuses_a_token_for_other_names(app: Any, client: httpx.AsyncClient, store: Store) -> None:
    """A named scope the token lacks is 403; an object by id outside its scopes is 404, answered exactly as an
    unknown id of that kind is (existence does not leak)."""
    values = await existing_objects(client)
    before = await event_count(client, store)
    checked = 0
    wrong: list[tuple[str, str, int, str]] = []
    hidden: list[tuple[str, str, str, httpx.Response]] = []
    for path, operations in app.openapi()["paths"].items():
        if not path.startswith("/v1/"):
            continue
        url = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)
        for method in operations:
            if method not in {"get", "post", "put", "delete"}:
                continue
            if (method, path) in (THRIFT, THRIFT_SINK):
                answer = await thrift_get_machine(client, url, values["ns"], values["id"])
                checked += 1
                if answer.status_code != 403:
                    wrong.append((method, path, answer.status_code, str(answer.headers)))
                continue
            body = BODIES.get((method, path), {}) if method in {"post", "put"} else None
            answer = await client.request(method, url, json=body, headers=as_("stranger"))
            checked += 1
            param = owned(operations[method]) if method != "put" else None
            if (method, path) in OWN_VIEW:
                if answer.status_code != 200 or "erp" in answer.text:
                    wrong.append((method, path, answer.status_code, answer.text[:200]))
            elif param is not None:
                hidden.append((method, path, param, answer))
            elif answer.status_code != 403 or answer.json()["code"] != "forbidden":
                wrong.append((method, path, answer.status_code, answer.text[:200]))
    assert wrong == [], "\n".join(map(str, wrong))
    assert checked >= 50
    assert await event_count(client, store) == before
    assert len(hidden) >= 15
    for method, path, param, answer in hidden:
        unknown = {**values, param: UNKNOWN[param]}
        url = re.sub(r"\{(\w+)\}", lambda m, unknown=unknown: unknown[m.group(1)], path)  # type: ignore[misc]
        body = BODIES.get((method, path), {}) if method in {"post", "put"} else None
        expected = await client.request(method, url, json=body, headers=as_("stranger"))
        seen = answer.json()
        seen["detail"] = seen["detail"].replace(values[param], UNKNOWN[param])
        if (answer.status_code, seen) != (expected.status_code, expected.json()) or answer.status_code not in (404, 409):
            wrong.append((method, path, answer.status_code, f"{answer.text[:200]} but unknown: {expected.text[:200]}"))
    assert wrong == [], "\n".join(map(str, wrong))


async def test_tokens_never_reach_the_log(client: httpx.AsyncClient, store: Store, caplog: pytest.LogCaptureFixture) -> None:
    _, token = await auth.create_token(store, "worker", ["queues:q"])
    wrong = token[:-4] + "abcd"
    with caplog.at_level(logging.DEBUG):
        assert (await client.post("/v1/queues/q/interactions", json={}, headers={"Authorization": f"Bearer {token}"})).status_code == 201
        assert (await client.get("/v1/queues/other", headers={"Authorization": f"Bearer {token}"})).status_code == 403
        assert (await client.get("/v1/queues/q", headers={"Authorization": f"Bearer {wrong}"})).status_code == 401
        assert (await client.get("/v1/queues/q", headers={"Authorization": f"Basic {token}"})).status_code == 401
        await client.post("/ui/login", data={"token": token})
        await client.post("/ui/login", data={"token": wrong})
    logged = "\n".join(record.getMessage() + (record.exc_text or "") for record in caplog.records)
    assert caplog.records, "nothing was logged at all: the check would be empty"
    assert token not in logged and wrong not in logged
    assert token[-20:] not in logged


def test_every_operation_declares_its_permission_and_no_handler_checks_one(app: Any) -> None:
    """Permission lives in the declaration only: the description shows it, and no handler looks at the
    caller's scopes itself."""
    import inspect

    document = app.openapi()
    described = [op for ops in document["paths"].values() for op in ops.values()]
    assert described and all(op["x-mainspring-permission"] for op in described)
    checking = [op.name for op in app.api.operations
                if re.search(r"principal|\.require|\.allows", inspect.getsource(op.handler))]
    assert checking == []
