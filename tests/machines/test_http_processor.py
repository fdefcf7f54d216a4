"""The processor protocol over HTTP: the same scenarios through a real processor served by the host."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from mainspring.machines.processor import Unprocessable, encode_request
from mainspring.store import ManualClock
from tests.conftest import free_port
from tests.machines.conftest import FakeProcessor, eventually

BASE = "/v1/namespaces/remote/machines"


async def use(client: httpx.AsyncClient, url: str, timeout_ms: int = 2000, **retry: Any) -> None:
    reply = await client.put("/v1/namespaces/remote", json={"processor": {"url": url, "timeout_ms": timeout_ms}, "retry": {"initial_ms": 1000, **retry}})
    assert reply.status_code == 200, reply.text


async def test_http_processor_drives_start_call_timer_and_notification(
    client: httpx.AsyncClient, http_fake: tuple[FakeProcessor, str], clock: ManualClock
) -> None:
    fake, url = http_fake
    await use(client, url)
    fake.on("init", lambda a, m: {"events": [a], "action": {"timer": {"in_ms": 50}}})
    assert (await client.post(BASE, json={"id": "m1", "args": "hi"})).status_code == 201
    assert (await client.post(f"{BASE}/m1/call", json={"args": 1})).json() == {"response": {"echo": 1}}
    await client.post(f"{BASE}/m1/notifications", json={"args": "n"})
    clock.advance(50)

    async def all_four() -> Any:
        body = (await client.get(f"{BASE}/m1")).json()
        return body if len(body["history"]) == 4 else None

    body = await eventually(all_four)
    assert sorted(fake.kinds()) == ["call", "init", "notification", "timeout"]
    assert body["history"][0]["data"] == "hi"
    assert fake.calls[1][2]["namespace"] == "remote" and fake.calls[1][2]["history"][0]["id"] == 1


async def test_http_processor_unreachable_is_502_and_creates_nothing(client: httpx.AsyncClient) -> None:
    await use(client, f"http://127.0.0.1:{free_port()}/")
    reply = await client.post(BASE, json={"id": "m1"})
    assert reply.status_code == 502 and reply.json()["code"] == "processor_failed"
    assert (await client.get(f"{BASE}/m1")).status_code == 404


async def test_http_processor_422_unprocessable_is_permanent_and_5xx_is_transient(
    client: httpx.AsyncClient, http_fake: tuple[FakeProcessor, str]
) -> None:
    fake, url = http_fake
    await use(client, url)
    await client.post(BASE, json={"id": "m1"})

    def crash(a: Any, m: Any) -> Any:
        raise RuntimeError("bug")

    def refuse(a: Any, m: Any) -> Any:
        raise Unprocessable("invalid")

    fake.on("call", crash)
    reply = await client.post(f"{BASE}/m1/call", json={})
    assert reply.status_code == 502 and reply.json()["code"] == "processor_failed"
    assert (await client.get(f"{BASE}/m1")).json()["status"] == "working"
    fake.on("call", refuse)
    reply = await client.post(f"{BASE}/m1/call", json={})
    assert reply.status_code == 502 and reply.json()["code"] == "processor_refused" and reply.json()["detail"].endswith("invalid")
    assert (await client.get(f"{BASE}/m1")).json()["status"] == "failed"
    fake.on("init", refuse)
    reply = await client.post(BASE, json={"id": "m2"})
    assert reply.status_code == 502 and reply.json()["code"] == "processor_refused"
    assert (await client.get(f"{BASE}/m2")).status_code == 404


async def test_call_slower_than_the_deadline_is_504_and_leaves_no_half_applied_step(
    client: httpx.AsyncClient, http_fake: tuple[FakeProcessor, str]
) -> None:
    fake, url = http_fake
    await use(client, url, timeout_ms=200)
    await client.post(BASE, json={"id": "m1"})
    before = (await client.get(f"{BASE}/m1")).json()
    finished = asyncio.Event()

    async def slow(a: Any, m: Any) -> Any:
        await asyncio.sleep(0.6)
        finished.set()
        return {"events": ["late"], "aux_state": "late", "action": {"timer": {"in_ms": 0}}, "response": "late"}

    fake.on("call", slow)
    reply = await client.post(f"{BASE}/m1/call", json={})
    assert reply.status_code == 504 and reply.json()["code"] == "processor_timeout"
    await asyncio.wait_for(finished.wait(), 5)
    await asyncio.sleep(0.1)
    after = (await client.get(f"{BASE}/m1")).json()
    assert after["history"] == before["history"] and after["aux_state"] == before["aux_state"] and after["timer"] is None
    assert after["version"] == before["version"]
    # A per-call deadline overrides the namespace's.
    fake.on("call", lambda a, m: {"response": "quick"})
    assert (await client.post(f"{BASE}/m1/call", json={"timeout_ms": 1000})).json() == {"response": "quick"}


async def test_start_slower_than_the_deadline_is_504_and_creates_nothing(client: httpx.AsyncClient, http_fake: tuple[FakeProcessor, str]) -> None:
    fake, url = http_fake
    await use(client, url, timeout_ms=100)

    async def slow(a: Any, m: Any) -> Any:
        await asyncio.sleep(0.4)
        return {"events": ["x"]}

    fake.on("init", slow)
    reply = await client.post(BASE, json={"id": "m1"})
    assert reply.status_code == 504 and reply.json()["code"] == "processor_timeout"
    await asyncio.sleep(0.4)
    assert (await client.get(f"{BASE}/m1")).status_code == 404


async def test_processor_host_answers_quietly_when_the_server_hangs_up_mid_request(caplog: Any) -> None:
    """A server killed while sending a step (found by the chaos runs): no traceback, nothing invoked."""
    from mainspring.machines.host import processor_app

    invoked: list[str] = []

    class Counter:
        def call(self, args: Any, machine: Any) -> dict[str, Any]:
            invoked.append("call")
            return {"events": []}

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "raw_path": b"/", "root_path": "", "query_string": b"",
             "headers": [(b"content-type", b"application/json")], "http_version": "1.1", "scheme": "http",
             "server": ("127.0.0.1", 9000), "client": ("127.0.0.1", 1234)}
    with caplog.at_level("WARNING"):
        await processor_app(Counter())(scope, receive, send)
    assert invoked == []
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


async def test_http_processor_is_reached_through_the_proxy_the_environment_names(client: httpx.AsyncClient, monkeypatch: Any) -> None:
    """``HTTP_PROXY`` applies to processor calls (and ``NO_PROXY`` exempts hosts), as for any HTTP client."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from tests.machines.conftest import serve_app

    targets: list[str] = []

    async def proxy(request: Request) -> JSONResponse:  # answers in the processor's place: what it got is the target
        targets.append(request.url.netloc)
        return JSONResponse({"events": ["through the proxy"]})

    async with serve_app(Starlette(routes=[Route("/", proxy, methods=["POST"])])) as proxy_url:
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        monkeypatch.setenv("NO_PROXY", "exempt.invalid")
        await use(client, "http://processor.invalid:9/")
        reply = await client.post(BASE, json={"id": "m1"})
        assert reply.status_code == 201 and reply.json()["history"][0]["data"] == "through the proxy"
        assert targets == ["processor.invalid:9"]
        await use(client, "http://exempt.invalid:9/")
        assert (await client.post(BASE, json={"id": "m2"})).json()["code"] == "processor_failed"  # not sent to the proxy
    assert targets == ["processor.invalid:9"]


def test_a_processor_request_is_compact_utf8_json_and_an_argument_json_cannot_carry_is_refused() -> None:
    machine: Any = {"namespace": "ns", "id": "é", "status": "working", "history": [{"id": 1, "created_at": None, "data": {"n": 2**70}}], "aux_state": None}
    body = encode_request("call", {"amount": 1.5, "note": "naïve"}, machine)
    assert body == json.dumps({"kind": "call", "args": {"amount": 1.5, "note": "naïve"}, "machine": machine}, ensure_ascii=False, separators=(",", ":")).encode()
    for bad in (float("nan"), [{"x": float("inf")}]):
        with pytest.raises(ValueError, match="not JSON compliant"):
            encode_request("call", bad, machine)
