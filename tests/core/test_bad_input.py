"""Garbage at every endpoint gets a problem+json 4xx with a code, never a 500, and changes nothing.

The routes are read from the app itself, so every face's endpoints are covered as they are added.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from sqlalchemy import func, select

from mainspring.core import outbox
from mainspring.core.tables import events
from mainspring.store import Store
from mainspring.web.routing import Operation, RawBody

BAD_NAMES = ["bad name", "a" * 200, "-leading-dash", "x%00y", "%2e%2e%2fetc", "ünïcode"]
# Machines take Machinegun's ids: any text up to 1 KiB (spaces, slashes, non-ASCII) but NUL.
BAD_MACHINE_NAMES = ["x%00y", "a" * 1025, "%C3%28"]


def v1_routes(app: Any) -> list[tuple[str, str, Operation]]:
    found = [(op.method, op.path, op) for op in app.api.operations if op.path.startswith("/v1")]
    assert len(found) >= 60, "the server's operations were not found: these tests would check nothing"
    return found


def fill(path: str, value: str = "x1") -> str:
    return re.sub(r"\{[^}]+\}", value, path)


def assert_problem(response: httpx.Response, where: str) -> None:
    assert 400 <= response.status_code < 500, f"{where}: {response.status_code} {response.text[:300]}"
    assert response.headers["content-type"].startswith("application/problem+json"), where
    body = response.json()
    assert body["status"] == response.status_code and isinstance(body["code"], str) and body["code"], where


async def event_count(store: Store) -> int:
    while await outbox.assign_positions(store):
        pass
    async with store.read() as conn:
        return int((await conn.execute(select(func.count()).select_from(events))).scalar_one())


async def test_garbage_bodies_get_problem_4xx_everywhere(app: Any, client: httpx.AsyncClient, store: Store) -> None:
    before = await event_count(store)
    bodies = [
        (b"{not json", "application/json"),
        (b'{"a":' * 5000 + b"1" + b"}" * 5000, "application/json"),
        (b'[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]', "application/json"),
        (b'{"id": 12, "args": {"x": "\\u0000"}, "data": "\\u0000", "worker": 5, "token": [], "max": "many"}', "application/json"),
        (b"\x00\xff\xfe binary", "application/json"),
        (b'"just a string"', "application/json"),
    ]
    for method, path, route in v1_routes(app):
        if method not in ("POST", "PUT", "PATCH") or route.body in (None, RawBody):
            continue  # no body, or any bytes are a body (a message, a Thrift call)
        for body, content_type in bodies:
            response = await client.request(method, fill(path), content=body, headers={"content-type": content_type})
            if response.status_code < 400:
                continue  # a route may accept any JSON (a free "args" body): fine, as long as it is not a 5xx
            assert_problem(response, f"{method} {path} with {body[:30]!r}")
    assert await event_count(store) == before


async def test_ten_megabyte_json_bodies_are_refused_with_413(app: Any, client: httpx.AsyncClient) -> None:
    big = b'{"data": "' + b"x" * (10 * 1024 * 1024) + b'"}'
    for method, path, _route in v1_routes(app):
        if method not in ("POST", "PUT", "PATCH") or "/messages" in path:
            continue  # exchange message bodies have their own, larger limit (exchange.max_message_bytes)
        response = await client.request(method, fill(path), content=big, headers={"content-type": "application/json"})
        assert response.status_code == 413, f"{method} {path}: {response.status_code}"
        assert_problem(response, f"{method} {path}")
        assert response.json()["code"] == "too_large"


async def test_bad_path_names_get_422_or_404(app: Any, client: httpx.AsyncClient, store: Store) -> None:
    before = await event_count(store)
    for method, path, _route in v1_routes(app):
        if "{" not in path:
            continue
        for bad in BAD_MACHINE_NAMES if path.startswith("/v1/namespaces") else BAD_NAMES:
            response = await client.request(method, fill(path, bad), json={})
            assert_problem(response, f"{method} {path} with {bad!r}")
    assert await event_count(store) == before


async def test_bad_query_values_are_invalid_request(client: httpx.AsyncClient) -> None:
    for params in ({"limit": "many"}, {"limit": "0"}, {"limit": "100000"}, {"after": "-1"}, {"wait_ms": "forever"}):
        response = await client.get("/v1/events", params=params)
        assert_problem(response, str(params))
        assert response.json()["code"] == "invalid_request"
        assert response.json()["errors"]


async def test_unknown_paths_and_methods_are_problem_json(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/v1/no-such-thing"), "unknown path")
    assert (await client.get("/v1/no-such-thing")).json()["code"] == "not_found"
    response = await client.delete("/v1/events")
    assert_problem(response, "wrong method")
    assert response.json()["code"] == "method_not_allowed"


def test_json_values_refuse_what_postgresql_cannot_store() -> None:
    import pytest
    from pydantic import TypeAdapter, ValidationError

    from mainspring.core.types import JsonValue

    adapter = TypeAdapter(JsonValue)
    for bad in ({"x": float("nan")}, [float("inf")], "a\x00b", {"k": "\ud800"}, {"a\x00": 1}):
        with pytest.raises(ValidationError):
            adapter.validate_python(bad)
    nested: object = 1
    for _ in range(100):
        nested = [nested]
    with pytest.raises(ValidationError):
        adapter.validate_python(nested)
    assert adapter.validate_python({"ok": [1, 2.5, "ü", None]}) == {"ok": [1, 2.5, "ü", None]}


async def test_a_form_body_is_refused_415_saying_a_json_body_was_expected(client: httpx.AsyncClient) -> None:
    # `curl -d '{…}'` sends application/x-www-form-urlencoded: the answer must say so, not "not a dictionary".
    form = {"content-type": "application/x-www-form-urlencoded"}
    for method, path in (("PUT", "/v1/queues/emails"), ("POST", "/v1/queues/emails/interactions"), ("POST", "/v1/queues/emails/lease")):
        response = await client.request(method, path, content=b'{"worker": "w1", "max": 1}', headers=form)
        assert response.status_code == 415, (path, response.text)
        problem = response.json()
        assert problem["code"] == "unsupported_media_type"
        assert problem["detail"] == "expected a JSON body, got Content-Type application/x-www-form-urlencoded (send Content-Type: application/json)"
    plain = await client.post("/v1/queues/emails/lease", json={"worker": "w1", "max": "many"})
    assert plain.json()["detail"] == "the request does not match the schema"


async def test_non_ascii_digits_are_refused_not_a_500(client: httpx.AsyncClient) -> None:
    """``²`` is a digit to ``str.isdigit`` and not to ``int``: ids, parents and cursors take ASCII digits only."""
    assert (await client.get("/v1/interactions/%C2%B2")).status_code == 404
    parent = await client.post("/v1/queues/q/interactions", json={"parent_id": "²"})
    assert parent.status_code == 404 and parent.json()["code"] == "parent_not_found"
    after = await client.get("/v1/events", params={"after": "²"})
    assert after.status_code == 422 and after.json()["code"] == "invalid_request"


async def test_json_false_is_not_the_integer_zero(client: httpx.AsyncClient) -> None:
    refused = await client.post("/v1/queues/q/interactions", json={"process_in_ms": False})
    assert refused.status_code == 422 and refused.json()["errors"][0]["loc"] == ["body", "process_in_ms"]
    assert (await client.post("/v1/queues/q/lease", json={"worker": "w", "max": 1, "wait_ms": False})).status_code == 422
    assert (await client.get("/v1/queues/q/interactions")).json()["interactions"] == []
