"""What every client shares: the connection, the token, error answers and the retry policy."""

from __future__ import annotations

from typing import Any, Self

import httpx
from tenacity import AsyncRetrying

from mainspring.client.errors import check_url, error_for, unreachable
from mainspring.client.policy import RetryPolicy


class AsyncBaseClient:
    """A connection to one server.

    ``base_url`` is ``http://HOST:PORT``; ``token`` a bearer token (None on an open server); ``timeout``
    in seconds per request; ``attempts`` and ``max_wait`` shape the retry policy of safe calls
    (``mainspring.client.policy``). ``transport`` replaces the network (tests, ASGI apps in-process).
    Use it as a context manager (``with`` / ``async with``), or close it when done.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        attempts: int = 4,
        max_wait: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = check_url(base_url)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)
        self.policy = RetryPolicy(attempts, max_wait)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        content: bytes | None = None,
        wait_ms: int | None = None,
    ) -> httpx.Response:
        """Send one call (again, under the retry policy) and answer its response, or raise its error.
        ``wait_ms``: the call long-polls that long, so its read timeout is extended by as much."""
        timeout = None
        if wait_ms:
            read = self._http.timeout.read or 60.0
            timeout = httpx.Timeout(self._http.timeout.connect, read=read + wait_ms / 1000, write=self._http.timeout.write, pool=self._http.timeout.pool)
        options: dict[str, Any] = {"params": _clean(params), "headers": headers}
        if content is not None:
            options["content"] = content
        elif json is not None:
            options["json"] = json
        if timeout is not None:
            options["timeout"] = timeout
        async for attempt in AsyncRetrying(**self.policy.arguments(idempotent)):
            with attempt:
                try:
                    response = await self._http.request(method, path, **options)
                except httpx.TransportError as exc:
                    raise unreachable(exc, self.base_url) from exc
                if response.status_code >= 400:
                    raise error_for(response, self.base_url)
                return response
        raise AssertionError("unreachable: the retry loop returns or raises")

    async def _json(self, method: str, path: str, *, idempotent: bool, **options: Any) -> Any:
        """``_request``, answering the JSON body (None for 204)."""
        response = await self._request(method, path, idempotent=idempotent, **options)
        return None if response.status_code == 204 else response.json()


def _clean(values: dict[str, Any] | None) -> dict[str, Any] | None:
    """Query parameters without the unset ones."""
    if values is None:
        return None
    return {k: v for k, v in values.items() if v is not None}


def body(**fields: Any) -> dict[str, Any]:
    """A JSON body without the unset (None) fields."""
    return {k: v for k, v in fields.items() if v is not None}
