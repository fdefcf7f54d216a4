"""Python clients for the batching API (API.md §4), sync and async, over httpx.

```python
from mainspring.client.batching import BatchingClient

with BatchingClient("http://127.0.0.1:8080", token="ms_…") as client:
    client.put_batcher("books", min_size=2, max_size=6, linger_ms=5000)
    task = client.submit("books", id="book-79-en", group="79", member="en", content=text)
    package = client.claim("books", worker="w1", wait_ms=10_000)
    if package:
        client.complete(package["id"], package["lease"]["token"], results={t["id"]: "ok" for t in package["tasks"]})
```
Errors come back as ``BatchingError`` with the problem's ``status`` and stable ``code``.
"""

from __future__ import annotations

from typing import Any

import httpx


class BatchingError(Exception):
    def __init__(self, status: int, code: str, detail: str, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail, self.problem = status, code, detail, problem


def _check(response: httpx.Response) -> Any:
    if response.status_code == 204:
        return None
    if response.status_code >= 400:
        try:
            problem = response.json()
        except ValueError:
            problem = {"code": "http_error", "detail": response.text[:500]}
        raise BatchingError(response.status_code, str(problem.get("code")), str(problem.get("detail")), problem)
    return response.json()


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _task_body(id: str, group: str, member: str, content: Any, data: Any) -> dict[str, Any]:
    body = {"id": id, "group": group, "member": member, "content": content}
    if data is not None:
        body["data"] = data
    return body


def _results_body(results: Any) -> Any:
    return results if results is None or isinstance(results, list | dict) else list(results)


class BatchingClient:
    """Synchronous client."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0, http: httpx.Client | None = None) -> None:
        self._http = http or httpx.Client(base_url=base_url.rstrip("/"), headers=_headers(token), timeout=timeout)

    def __enter__(self) -> BatchingClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def put_batcher(self, name: str, **settings: Any) -> dict[str, Any]:
        return _check(self._http.put(f"/v1/batchers/{name}", json=settings))  # type: ignore[no-any-return]

    def get_batcher(self, name: str) -> dict[str, Any]:
        return _check(self._http.get(f"/v1/batchers/{name}"))  # type: ignore[no-any-return]

    def submit(self, name: str, *, id: str, group: str, member: str, content: Any, data: Any = None) -> dict[str, Any]:
        """The task; its ``status`` says pending (accepted) or rejected (``reason`` duplicate)."""
        return _check(self._http.post(f"/v1/batchers/{name}/tasks", json=_task_body(id, group, member, content, data)))  # type: ignore[no-any-return]

    def task(self, name: str, task_id: str) -> dict[str, Any]:
        return _check(self._http.get(f"/v1/batchers/{name}/tasks/{task_id}"))  # type: ignore[no-any-return]

    def claim(self, name: str, worker: str, lease_ms: int | None = None, wait_ms: int | None = None) -> dict[str, Any] | None:
        """A package with its ``lease``, or None when none was waiting within ``wait_ms``."""
        body = {"worker": worker, "lease_ms": lease_ms, "wait_ms": wait_ms}
        timeout = self._http.timeout.read
        extra = (wait_ms or 0) / 1000 + (timeout or 30)
        return _check(self._http.post(f"/v1/batchers/{name}/packages/claim", json={k: v for k, v in body.items() if v is not None}, timeout=extra))  # type: ignore[no-any-return]

    def heartbeat(self, package_id: str, token: str, lease_ms: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"token": token}
        if lease_ms is not None:
            body["lease_ms"] = lease_ms
        return _check(self._http.post(f"/v1/packages/{package_id}/heartbeat", json=body))  # type: ignore[no-any-return]

    def complete(self, package_id: str, token: str, results: Any = None) -> dict[str, Any]:
        return _check(self._http.post(f"/v1/packages/{package_id}/complete", json={"token": token, "results": _results_body(results)}))  # type: ignore[no-any-return]

    def fail(self, package_id: str, token: str, error: str, retry: bool = False) -> dict[str, Any]:
        return _check(self._http.post(f"/v1/packages/{package_id}/fail", json={"token": token, "error": error, "retry": retry}))  # type: ignore[no-any-return]

    def package(self, package_id: str) -> dict[str, Any]:
        return _check(self._http.get(f"/v1/packages/{package_id}"))  # type: ignore[no-any-return]

    def packages(self, name: str, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        return _check(self._http.get(f"/v1/batchers/{name}/packages", params=params))["packages"]  # type: ignore[no-any-return]

    def versions(self, name: str, group: str, member: str) -> list[dict[str, Any]]:
        return _check(self._http.get(f"/v1/batchers/{name}/versions/{group}/{member}"))["versions"]  # type: ignore[no-any-return]

    def events(self, after: str | None = None, types: str | None = None, limit: int = 1000) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        if types:
            params["types"] = types
        return _check(self._http.get("/v1/events", params=params))  # type: ignore[no-any-return]


class AsyncBatchingClient:
    """Asynchronous client; the same calls as ``BatchingClient``, awaited."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0, http: httpx.AsyncClient | None = None) -> None:
        self._http = http or httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=_headers(token), timeout=timeout)

    async def __aenter__(self) -> AsyncBatchingClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def put_batcher(self, name: str, **settings: Any) -> dict[str, Any]:
        return _check(await self._http.put(f"/v1/batchers/{name}", json=settings))  # type: ignore[no-any-return]

    async def get_batcher(self, name: str) -> dict[str, Any]:
        return _check(await self._http.get(f"/v1/batchers/{name}"))  # type: ignore[no-any-return]

    async def submit(self, name: str, *, id: str, group: str, member: str, content: Any, data: Any = None) -> dict[str, Any]:
        return _check(await self._http.post(f"/v1/batchers/{name}/tasks", json=_task_body(id, group, member, content, data)))  # type: ignore[no-any-return]

    async def task(self, name: str, task_id: str) -> dict[str, Any]:
        return _check(await self._http.get(f"/v1/batchers/{name}/tasks/{task_id}"))  # type: ignore[no-any-return]

    async def claim(self, name: str, worker: str, lease_ms: int | None = None, wait_ms: int | None = None) -> dict[str, Any] | None:
        body = {"worker": worker, "lease_ms": lease_ms, "wait_ms": wait_ms}
        timeout = self._http.timeout.read
        extra = (wait_ms or 0) / 1000 + (timeout or 30)
        return _check(await self._http.post(f"/v1/batchers/{name}/packages/claim", json={k: v for k, v in body.items() if v is not None}, timeout=extra))  # type: ignore[no-any-return]

    async def heartbeat(self, package_id: str, token: str, lease_ms: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"token": token}
        if lease_ms is not None:
            body["lease_ms"] = lease_ms
        return _check(await self._http.post(f"/v1/packages/{package_id}/heartbeat", json=body))  # type: ignore[no-any-return]

    async def complete(self, package_id: str, token: str, results: Any = None) -> dict[str, Any]:
        return _check(await self._http.post(f"/v1/packages/{package_id}/complete", json={"token": token, "results": _results_body(results)}))  # type: ignore[no-any-return]

    async def fail(self, package_id: str, token: str, error: str, retry: bool = False) -> dict[str, Any]:
        return _check(await self._http.post(f"/v1/packages/{package_id}/fail", json={"token": token, "error": error, "retry": retry}))  # type: ignore[no-any-return]

    async def package(self, package_id: str) -> dict[str, Any]:
        return _check(await self._http.get(f"/v1/packages/{package_id}"))  # type: ignore[no-any-return]

    async def packages(self, name: str, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        return _check(await self._http.get(f"/v1/batchers/{name}/packages", params=params))["packages"]  # type: ignore[no-any-return]

    async def versions(self, name: str, group: str, member: str) -> list[dict[str, Any]]:
        return _check(await self._http.get(f"/v1/batchers/{name}/versions/{group}/{member}"))["versions"]  # type: ignore[no-any-return]

    async def events(self, after: str | None = None, types: str | None = None, limit: int = 1000) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        if types:
            params["types"] = types
        return _check(await self._http.get("/v1/events", params=params))  # type: ignore[no-any-return]
