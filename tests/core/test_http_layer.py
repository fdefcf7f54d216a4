"""The request path every operation shares (web.routing, web.http, web.openapi): how a request finds its
operation, what it is refused with, and what the API description says."""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from mainspring.core.auth import Authenticator
from mainspring.core.errors import InvalidRequest
from mainspring.core.runtime import Context
from mainspring.core.types import Name, Page
from mainspring.store import Store
from mainspring.web.http import Api
from mainspring.web.permissions import PUBLIC, Scope
from mainspring.web.routing import (
    AnySegment,
    Call,
    MissingPermission,
    Operation,
    PathParamError,
    Reply,
    Routes,
    RouteTable,
)
from tests.core.test_store import stored_cursors, write_then_fail_quietly


def _table(*paths: tuple[str, str]) -> RouteTable:
    routes = Routes("/v1", tag="t")
    for method, path in paths:
        async def handler(call: Call, *values: str) -> dict[str, str]:
            return {}

        # A handler per path, its signature naming the path's parameters (``queue`` typed as a queue's name).
        names = re.findall(r"\{(\w+)\}", path)
        handler.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("call", *names)])
        handler.__annotations__ = {"call": Call, **{n: Name if n == "queue" else AnySegment for n in names},
                                   "return": dict[str, str]}
        handler.__name__ = f"{method}_{path}"
        routes.add(method, path, handler, permission=PUBLIC)
    return RouteTable(routes.operations)


def test_an_operation_without_a_permission_is_refused_when_declared() -> None:
    routes = Routes("/v1", tag="t")
    with pytest.raises(MissingPermission, match="declares no permission"):
        @routes.get("/things/{id}")
        async def read_thing(call: Call, id: Name) -> dict[str, str]:
            return {}
    assert routes.operations == []


def test_a_face_module_declaring_an_operation_without_a_permission_does_not_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "careless_face.py").write_text(
        "from mainspring.web.routing import Call, Routes\n"
        "routes = Routes('/v1', tag='careless')\n"
        "@routes.post('/queues/{queue}/wipe')\n"
        "async def wipe(call: Call, queue: str) -> None: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingPermission):
        importlib.import_module("careless_face")


def test_the_signature_declares_path_parameters_body_query_and_answer() -> None:
    routes = Routes("/v1", tag="t")

    @routes.post("/queues/{queue}/things", permission=Scope("queues:{queue}"), problems=[InvalidRequest])
    async def make(call: Call, queue: Name, body: _Shape | None, query: Page) -> _Shape | Reply:
        return body or _Shape(a=0)

    [operation] = routes.operations
    assert (operation.params, operation.body, operation.body_required, operation.query, operation.answer) == (
        {"queue": Name}, _Shape, False, Page, _Shape)
    assert operation.permission.describe() == "queues:{queue}"


def test_a_literal_segment_wins_over_a_parameter_in_the_same_place() -> None:
    table = _table(("POST", "/queues/{queue}/interactions/{id}"), ("POST", "/queues/{queue}/interactions/bulk"))
    found = table.find("POST", b"/v1/queues/q/interactions/bulk")
    assert found is not None and found[0].path == "/v1/queues/{queue}/interactions/bulk"
    found = table.find("POST", b"/v1/queues/q/interactions/7")
    assert found is not None and found[1] == {"queue": "q", "id": "7"}


def test_each_path_segment_is_percent_decoded_on_its_own() -> None:
    table = _table(("GET", "/things/{id}/parts/{part}"))
    found = table.find("GET", b"/v1/things/ff%2Fidentity/parts/%D0%B0%2Fb")
    assert found is not None and found[1] == {"id": "ff/identity", "part": "а/b"}


def test_a_segment_its_type_refuses_is_a_path_error_not_a_miss() -> None:
    table = _table(("GET", "/queues/{queue}"))
    found = table.find("GET", b"/v1/queues/a%2Fb")
    assert found is not None and isinstance(found[1], PathParamError) and found[1].name == "queue"
    bad_utf8 = table.find("GET", b"/v1/queues/%FF")
    assert bad_utf8 is not None and isinstance(bad_utf8[1], PathParamError)


def test_empty_segments_and_unknown_shapes_find_nothing() -> None:
    table = _table(("GET", "/queues/{queue}"))
    assert table.find("GET", b"/v1/queues/") is None
    assert table.find("GET", b"/v1/queues/a/b") is None
    assert table.find("POST", b"/v1/queues/a") is None
    assert table.allowed(b"/v1/queues/a") == ["GET"]


def test_get_operations_answer_head_too() -> None:
    table = _table(("GET", "/queues/{queue}"))
    assert table.find("HEAD", b"/v1/queues/a") is not None


def test_two_operations_on_one_method_and_path_are_refused() -> None:
    with pytest.raises(ValueError, match="two operations"):
        _table(("GET", "/queues/{queue}"), ("GET", "/queues/{name}"))


async def test_a_wrong_method_is_405_with_allow(client: httpx.AsyncClient) -> None:
    answer = await client.delete("/v1/queues/q/interactions")
    assert answer.status_code == 405
    assert answer.headers["allow"] == "GET, POST"
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["code"] == "method_not_allowed"


async def test_a_path_parameter_its_type_refuses_is_422_at_its_location(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v1/queues/a%2Fb/interactions", json={"data": 1})
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["loc"] == ["path", "queue"]


async def test_a_percent_encoded_name_reaches_its_queue(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v1/queues/a%2Eb/interactions", json={"data": 1})
    assert answer.status_code == 201
    assert answer.json()["queue"] == "a.b"


async def test_a_body_streamed_past_the_limit_is_413_without_a_length(app: Any) -> None:
    settings = app.state.context.settings

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(settings.server.max_json_bytes // 65536 + 2):
            yield b" " * 65536

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        answer = await client.post("/v1/queues/q/interactions", content=chunks(), headers={"content-type": "application/json"})
    assert answer.status_code == 413
    assert answer.json()["code"] == "too_large"


async def test_an_empty_body_where_one_is_required_is_422_at_body(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v1/queues/q/lease")
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["loc"] == ["body"]


async def test_every_operation_is_described_and_every_description_is_served(app: Any, client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    described = {(method.upper(), path) for path, operations in document["paths"].items() for method in operations}
    served = {(op.method, op.path) for op in app.api.operations if op.in_schema}
    assert described == served
    assert document["openapi"] == "3.1.0"
    ids = [op["operationId"] for ops in document["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
    create = document["paths"]["/v1/queues/{queue}/interactions"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/CreateIn"}
    assert set(create["responses"]) >= {"201", "200", "401", "403", "404", "422"}
    assert create["security"] == [{"bearer": []}]
    assert "security" not in document["paths"]["/healthz"]["get"]


class _Shape(BaseModel):
    a: int


def _api(handler: Any, store: Store | None = None, **options: Any) -> tuple[Api, Operation]:
    from mainspring.config import load_settings

    routes = Routes("/v1", tag="t")
    operation = routes.add("GET", "/shape", handler, permission=PUBLIC, answer=_Shape, **options)
    settings = load_settings(None)
    ctx = Context(settings=settings, store=store)  # type: ignore[arg-type]
    authenticator = Authenticator(None, [], 1000)  # type: ignore[arg-type]
    authenticator.is_open = _open  # type: ignore[method-assign]
    return Api(ctx, authenticator, routes.operations, max_json_bytes=1 << 20, check_answers=True), operation


async def _open() -> bool:
    return True


async def _call(api: Api, operation: Operation) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/v1/shape", "headers": [], "query_string": b""}
    await api.serve(operation, {}, scope, receive, send)
    return sent


@pytest.mark.parametrize("answer", [{"a": 1, "extra": 2}, {}, {"a": "1"}])
async def test_with_answer_checks_on_an_answer_off_its_schema_fails_the_request(answer: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    async def handler(call: Call) -> Any:
        return answer

    api, operation = _api(handler)
    with caplog.at_level(logging.ERROR):
        sent = await _call(api, operation)
    assert sent[0]["status"] == 500
    assert "answered" in caplog.text


async def test_an_answer_on_its_schema_passes_the_check_and_carries_a_request_id() -> None:
    async def handler(call: Call) -> Any:
        return {"a": 1}

    api, operation = _api(handler)
    sent = await _call(api, operation)
    assert sent[0]["status"] == 200 and sent[1]["body"] == b'{"a":1}'
    assert dict(sent[0]["headers"])[b"x-request-id"]


async def test_the_answer_is_encoded_as_its_declared_type_so_a_field_it_does_not_declare_is_not_sent() -> None:
    async def handler(call: Call) -> Any:
        return {"a": 1, "secret": "internal"}

    api, operation = _api(handler)
    api.check_answers = False
    sent = await _call(api, operation)
    assert sent[0]["status"] == 200 and sent[1]["body"] == b'{"a":1}'


async def test_a_returned_model_of_the_declared_type_is_sent_as_its_fields() -> None:
    async def handler(call: Call) -> Any:
        return _Shape(a=2)

    api, operation = _api(handler)
    sent = await _call(api, operation)
    assert sent[0]["status"] == 200 and sent[1]["body"] == b'{"a":2}'


async def test_an_unexpected_error_is_a_500_problem_without_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    async def handler(call: Call) -> Any:
        raise RuntimeError("secret internals")

    api, operation = _api(handler)
    with caplog.at_level(logging.ERROR):
        sent = await _call(api, operation)
    assert sent[0]["status"] == 500
    assert b"secret" not in sent[1]["body"] and b"internal" in sent[1]["body"]
    assert "secret internals" in caplog.text


async def test_a_handler_whose_failed_statement_was_caught_answers_2xx_only_if_its_write_committed(store: Store, engine: str) -> None:
    async def handler(call: Call) -> Any:
        await call.store.grouped(lambda tx: write_then_fail_quietly(tx, "quiet"))
        return {"a": 1}

    api, operation = _api(handler, store)
    sent = await _call(api, operation)
    assert (sent[0]["status"] < 300) == ("quiet" in await stored_cursors(store))
    assert sent[0]["status"] == (500 if engine == "postgres" else 200)


async def test_a_reply_with_a_media_type_sends_its_bytes_as_they_are() -> None:
    async def handler(call: Call) -> Any:
        return Reply(b"\x00\x01", status=200, media_type="application/x-thing", headers={"X-Extra": "1"})

    api, operation = _api(handler, body=None)
    sent = await _call(api, operation)
    headers = dict(sent[0]["headers"])
    assert (headers[b"content-type"], headers[b"x-extra"], sent[1]["body"]) == (b"application/x-thing", b"1", b"\x00\x01")


async def test_a_raw_body_is_described_as_bytes_and_reaches_the_handler_as_sent(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    put = document["paths"]["/v1/exchange/mailboxes/{addressee}/{database}/messages"]["post"]
    assert put["requestBody"]["content"] == {"application/octet-stream": {"schema": {"type": "string", "format": "binary", "minLength": 1}}}
    stored = await client.post("/v1/exchange/mailboxes/a/b/messages", content=b"\xff\x00{not json")
    assert stored.status_code == 201
    body = await client.get(f"/v1/exchange/mailboxes/a/b/messages/{stored.json()['id']}")
    assert body.content == b"\xff\x00{not json"
