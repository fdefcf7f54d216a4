"""Python client for the machines face (the Automaton API of API.md §2), sync and async.

```python
from mainspring.client.machines import MachinesClient

with MachinesClient("http://127.0.0.1:8080", token="ms_…") as mg:
    mg.put_namespace("invoices", url="http://127.0.0.1:9000/", timeout_ms=5000)
    mg.start("invoices", "inv-1", {"amount": 100}, idempotency_key="start-inv-1")
    mg.call("invoices", "inv-1", {"pay": 100})
    print(mg.get("invoices", "inv-1")["history"])
```
``AsyncMachinesClient`` has the same methods, awaited. Errors raise :class:`MachinesError` with the
problem's ``status`` and ``code`` (``machine_not_found``, ``processor_timeout``…).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx


class MachinesError(Exception):
    """An error answer of the server, as its problem+json says."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {problem.get('code')}: {problem.get('detail')}")
        self.status = status
        self.code = problem.get("code")
        self.problem = problem


@dataclass
class _Request:
    method: str
    path: str
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    answer: str | None = None
    """The field of the JSON answer the method returns (None: the whole body)."""


def _m(ns: str, machine_id: str | None = None) -> str:
    path = f"/v1/namespaces/{quote(ns, safe='')}/machines"
    return path if machine_id is None else f"{path}/{quote(machine_id, safe='')}"


def _key(idempotency_key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": idempotency_key} if idempotency_key else {}


class _Requests:
    """What each method sends; the two clients only differ in how they send it."""

    @staticmethod
    def put_namespace(ns: str, url: str | None, timeout_ms: int, retry: dict[str, Any] | None, history: dict[str, Any] | None) -> _Request:
        body: dict[str, Any] = {"processor": {"url": url, "timeout_ms": timeout_ms}}
        if retry is not None:
            body["retry"] = retry
        if history is not None:
            body["history"] = history
        return _Request("PUT", f"/v1/namespaces/{quote(ns, safe='')}", body)

    @staticmethod
    def start(ns: str, machine_id: str, args: Any, key: str | None) -> _Request:
        return _Request("POST", _m(ns), {"id": machine_id, "args": args}, headers=_key(key))

    @staticmethod
    def call(ns: str, machine_id: str, args: Any, key: str | None, timeout_ms: int | None) -> _Request:
        body: dict[str, Any] = {"args": args}
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        return _Request("POST", _m(ns, machine_id) + "/call", body, headers=_key(key), answer="response")

    @staticmethod
    def notify(ns: str, machine_id: str, args: Any, key: str | None) -> _Request:
        return _Request("POST", _m(ns, machine_id) + "/notifications", {"args": args}, headers=_key(key), answer="id")

    @staticmethod
    def repair(ns: str, machine_id: str, args: Any, key: str | None, simple: bool) -> _Request:
        return _Request("POST", _m(ns, machine_id) + "/repair", {"args": args, "simple": simple}, headers=_key(key), answer="response")

    @staticmethod
    def get(ns: str, machine_id: str, after: int | None, limit: int | None, direction: str) -> _Request:
        params = {k: v for k, v in {"after": after, "limit": limit, "direction": direction}.items() if v is not None}
        return _Request("GET", _m(ns, machine_id), params=params)

    @staticmethod
    def list(ns: str, status: str | None, limit: int, cursor: str | None) -> _Request:
        params = {k: v for k, v in {"status": status, "limit": limit, "cursor": cursor}.items() if v is not None}
        return _Request("GET", _m(ns), params=params)

    @staticmethod
    def operation(ns: str, machine_id: str, key: str) -> _Request:
        return _Request("GET", _m(ns, machine_id) + f"/operations/{quote(key, safe='')}")


def _result(request: _Request, reply: httpx.Response) -> Any:
    if reply.status_code >= 400:
        try:
            problem = reply.json()
        except ValueError:
            problem = {"code": "http_error", "detail": reply.text[:500]}
        raise MachinesError(reply.status_code, problem if isinstance(problem, dict) else {"detail": problem})
    if reply.status_code == 204:
        return None
    body = reply.json()
    return body[request.answer] if request.answer else body


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class MachinesClient:
    """Blocking client."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 60.0, transport: httpx.BaseTransport | None = None) -> None:
        self._http = httpx.Client(base_url=base_url, headers=_headers(token), timeout=timeout, transport=transport)

    def __enter__(self) -> MachinesClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, request: _Request) -> Any:
        reply = self._http.request(request.method, request.path, json=request.json, params=request.params, headers=request.headers)
        return _result(request, reply)

    def put_namespace(self, ns: str, *, url: str | None = None, timeout_ms: int = 30_000, retry: dict[str, Any] | None = None, history: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._send(_Requests.put_namespace(ns, url, timeout_ms, retry, history))  # type: ignore[no-any-return]

    def get_namespace(self, ns: str) -> dict[str, Any]:
        return self._send(_Request("GET", f"/v1/namespaces/{quote(ns, safe='')}"))  # type: ignore[no-any-return]

    def start(self, ns: str, machine_id: str, args: Any = None, *, idempotency_key: str | None = None) -> dict[str, Any]:
        return self._send(_Requests.start(ns, machine_id, args, idempotency_key))  # type: ignore[no-any-return]

    def call(self, ns: str, machine_id: str, args: Any = None, *, idempotency_key: str | None = None, timeout_ms: int | None = None) -> Any:
        return self._send(_Requests.call(ns, machine_id, args, idempotency_key, timeout_ms))

    def notify(self, ns: str, machine_id: str, args: Any = None, *, idempotency_key: str | None = None) -> str:
        return self._send(_Requests.notify(ns, machine_id, args, idempotency_key))  # type: ignore[no-any-return]

    def repair(self, ns: str, machine_id: str, args: Any = None, *, simple: bool = False, idempotency_key: str | None = None) -> Any:
        return self._send(_Requests.repair(ns, machine_id, args, idempotency_key, simple))

    def get(self, ns: str, machine_id: str, *, after: int | None = None, limit: int | None = None, direction: str = "forward") -> dict[str, Any]:
        return self._send(_Requests.get(ns, machine_id, after, limit, direction))  # type: ignore[no-any-return]

    def remove(self, ns: str, machine_id: str) -> None:
        self._send(_Request("DELETE", _m(ns, machine_id)))

    def operation(self, ns: str, machine_id: str, key: str) -> dict[str, Any]:
        return self._send(_Requests.operation(ns, machine_id, key))  # type: ignore[no-any-return]

    def list(self, ns: str, *, status: str | None = None, limit: int = 100) -> Iterator[dict[str, Any]]:
        """Every machine of the namespace (optionally of one status), page by page."""
        cursor = None
        while True:
            page = self._send(_Requests.list(ns, status, limit, cursor))
            yield from page["machines"]
            cursor = page["next_cursor"]
            if not cursor:
                return


class AsyncMachinesClient:
    """asyncio client; the same methods as :class:`MachinesClient`, awaited."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 60.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(token), timeout=timeout, transport=transport)

    async def __aenter__(self) -> AsyncMachinesClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, request: _Request) -> Any:
        reply = await self._http.request(request.method, request.path, json=request.json, params=request.params, headers=request.headers)
        return _result(request, reply)

    async def put_namespace(self, ns: str, *, url: str | None = None, timeout_ms: int = 30_000, retry: dict[str, Any] | None = None, history: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self._send(_Requests.put_namespace(ns, url, timeout_ms, retry, history))  # type: ignore[no-any-return]

    async def get_namespace(self, ns: str) -> dict[str, Any]:
        return await self._send(_Request("GET", f"/v1/namespaces/{quote(ns, safe='')}"))  # type: ignore[no-any-return]

    async def start(self, ns: str, machine_id: str, args: Any = None, *, idempotency_key: str | None = None) -> dict[str, Any]:
        return await self._send(_Requests.start(ns, machine_id, args, idempotency_key))  # type: ignore[no-any-return]

    async def call(self, ns: str, machine_id: str, args: Any = None, *, idempotency_key: str | None = None, timeout_ms: int | None = None) -> Any:
        return await self._send(_Requests.call(ns, machine_id, args, idempotency_key, timeout_ms))

    async def notify(self, ns: str, machine_id: str, args: Any = None, *, idempotency_key: str | None = None) -> str:
        return await self._send(_Requests.notify(ns, machine_id, args, idempotency_key))  # type: ignore[no-any-return]

    async def repair(self, ns: str, machine_id: str, args: Any = None, *, simple: bool = False, idempotency_key: str | None = None) -> Any:
        return await self._send(_Requests.repair(ns, machine_id, args, idempotency_key, simple))

    async def get(self, ns: str, machine_id: str, *, after: int | None = None, limit: int | None = None, direction: str = "forward") -> dict[str, Any]:
        return await self._send(_Requests.get(ns, machine_id, after, limit, direction))  # type: ignore[no-any-return]

    async def remove(self, ns: str, machine_id: str) -> None:
        await self._send(_Request("DELETE", _m(ns, machine_id)))

    async def operation(self, ns: str, machine_id: str, key: str) -> dict[str, Any]:
        return await self._send(_Requests.operation(ns, machine_id, key))  # type: ignore[no-any-return]

    async def list(self, ns: str, *, status: str | None = None, limit: int = 100) -> AsyncIterator[dict[str, Any]]:
        cursor = None
        while True:
            page = await self._send(_Requests.list(ns, status, limit, cursor))
            for item in page["machines"]:
                yield item
            cursor = page["next_cursor"]
            if not cursor:
                return
