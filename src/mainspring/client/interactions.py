"""Python client of the interactions face (API.md §3), sync and async, over httpx.

```python
from mainspring.client.interactions import AsyncInteractionsClient

async with AsyncInteractionsClient("http://127.0.0.1:8080", token="ms_…") as client:
    item = await client.create("emails", data={"to": "a@b.c"}, message_id="order-17")
    done = await client.get(item["id"], wait_ms=30_000)
```
Every method answers the JSON body; a problem answer raises ``InteractionsError`` with its ``code``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx


class InteractionsError(Exception):
    """A problem+json answer: ``status``, ``code`` (stable, match on it) and the whole ``problem``."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {problem.get('code')}: {problem.get('detail')}")
        self.status = status
        self.code = problem.get("code")
        self.problem = problem


Call = tuple[str, str, dict[str, Any]]


def _clean(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class _Calls:
    """The HTTP calls, as (method, path, httpx kwargs); both clients send them."""

    @staticmethod
    def put_queue(queue: str, **settings: Any) -> Call:
        return "PUT", f"/v1/queues/{queue}", {"json": settings}

    @staticmethod
    def get_queue(queue: str) -> Call:
        return "GET", f"/v1/queues/{queue}", {}

    @staticmethod
    def create(queue: str, **fields: Any) -> Call:
        return "POST", f"/v1/queues/{queue}/interactions", {"json": _clean(fields)}

    @staticmethod
    def create_many(queue: str, items: list[dict[str, Any]]) -> Call:
        return "POST", f"/v1/queues/{queue}/interactions/bulk", {"json": {"interactions": items}}

    @staticmethod
    def get(interaction_id: str, wait_ms: int | None = None) -> Call:
        return "GET", f"/v1/interactions/{interaction_id}", {"params": _clean({"wait_ms": wait_ms})}

    @staticmethod
    def list(queue: str, **filters: Any) -> Call:
        return "GET", f"/v1/queues/{queue}/interactions", {"params": _clean(filters)}

    @staticmethod
    def children(interaction_id: str, name: str | None = None, **paging: Any) -> Call:
        return "GET", f"/v1/interactions/{interaction_id}/children", {"params": _clean({"name": name, **paging})}

    @staticmethod
    def latest_child(interaction_id: str, name: str | None = None) -> Call:
        return "GET", f"/v1/interactions/{interaction_id}/children/latest", {"params": _clean({"name": name})}

    @staticmethod
    def complete(interaction_id: str, result: Any = None) -> Call:
        return "POST", f"/v1/interactions/{interaction_id}/complete", {"json": {"result": result}}

    @staticmethod
    def fail(interaction_id: str, error: str) -> Call:
        return "POST", f"/v1/interactions/{interaction_id}/fail", {"json": {"error": error}}

    @staticmethod
    def cancel(interaction_id: str) -> Call:
        return "POST", f"/v1/interactions/{interaction_id}/cancel", {}

    @staticmethod
    def schedule(interaction_id: str, process_at: str | None = None, process_in_ms: int | None = None) -> Call:
        return "POST", f"/v1/interactions/{interaction_id}/schedule", {"json": _clean({"process_at": process_at, "process_in_ms": process_in_ms})}

    @staticmethod
    def lease(queue: str, worker: str, max: int = 1, lease_ms: int | None = None, wait_ms: int | None = None) -> Call:
        body = _clean({"worker": worker, "max": max, "lease_ms": lease_ms, "wait_ms": wait_ms})
        return "POST", f"/v1/queues/{queue}/lease", {"json": body}

    @staticmethod
    def heartbeat(interaction_id: str, token: str, lease_ms: int | None = None) -> Call:
        return "POST", f"/v1/interactions/{interaction_id}/heartbeat", {"json": _clean({"token": token, "lease_ms": lease_ms})}

    @staticmethod
    def release(interaction_id: str, token: str, outcome: dict[str, Any]) -> Call:
        """``outcome``: ``{"complete": {"result": …}}``, ``{"fail": {"error": …}}``, ``{"repeat": {"in_ms": …}}``,
        ``{"wait": {}}`` or ``{"retry": {"error": …}}``."""
        return "POST", f"/v1/interactions/{interaction_id}/release", {"json": {"token": token, "outcome": outcome}}


def _answer(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            problem = response.json()
        except ValueError:
            problem = {"code": "http_error", "detail": response.text[:500]}
        raise InteractionsError(response.status_code, problem)
    return response.json()


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class InteractionsClient:
    """Blocking client."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 60) -> None:
        self._http = httpx.Client(base_url=base_url, headers=_headers(token), timeout=timeout)

    def __enter__(self) -> InteractionsClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def __getattr__(self, name: str) -> Any:
        call = getattr(_Calls, name)

        def send(*args: Any, **kwargs: Any) -> Any:
            method, path, options = call(*args, **kwargs)
            return _answer(self._http.request(method, path, **options))

        return send

    def iterate(self, queue: str, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every interaction of ``queue`` matching ``filters``, page by page."""
        cursor = None
        while True:
            page = self.list(queue, cursor=cursor, **filters)
            yield from page["interactions"]
            cursor = page["next_cursor"]
            if not cursor:
                return


class AsyncInteractionsClient:
    """Async client."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 60) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(token), timeout=timeout)

    async def __aenter__(self) -> AsyncInteractionsClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def __getattr__(self, name: str) -> Any:
        call = getattr(_Calls, name)

        async def send(*args: Any, **kwargs: Any) -> Any:
            method, path, options = call(*args, **kwargs)
            return _answer(await self._http.request(method, path, **options))

        return send
