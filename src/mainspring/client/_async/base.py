"""What every client shares: the connection, the token, error answers and the retry policy."""

from __future__ import annotations

import json as _json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Self, TypedDict, Unpack

from tenacity import AsyncRetrying

from mainspring.client import transports
from mainspring.client.errors import ServiceUnavailable, check_url, error_for, unreachable
from mainspring.client.policy import RetryPolicy
from mainspring.client.transports import Reply, Unreachable
from mainspring.types import JsonData

if TYPE_CHECKING:
    import httpx

JSON_HEADERS = {"content-type": "application/json"}


class RequestOptions(TypedDict, total=False):
    """What ``_json`` passes on to ``_request`` besides the method, the path and ``idempotent``."""

    json: object
    """Sent as JSON (``json.dumps``)."""
    params: Mapping[str, object] | None
    headers: dict[str, str] | None
    content: bytes | None
    wait_ms: int | None


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
        self._http = transports.AsyncConnection.for_url(self.base_url, headers, timeout, transport)
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
        json: object = None,
        params: Mapping[str, object] | None = None,
        headers: dict[str, str] | None = None,
        content: bytes | None = None,
        wait_ms: int | None = None,
    ) -> Reply:
        """Send one call (again, under the retry policy) and answer its response, or raise its error.
        ``wait_ms``: the call long-polls that long, so its read timeout is extended by as much."""
        if content is None and json is not None:
            # As httpx writes a JSON body: compact, UTF-8, no NaN.
            content = _json.dumps(json, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            headers = {**JSON_HEADERS, **headers} if headers else JSON_HEADERS
        try:
            # The first attempt outside the retry loop: setting tenacity's loop up for a call that succeeds was a
            # tenth of the client's CPU per call (issue 36). Only a call the policy may retry enters it.
            return await self._attempt(method, path, params, headers, content, wait_ms)
        except ServiceUnavailable as exc:
            first: ServiceUnavailable | None = exc
        async for attempt in AsyncRetrying(**self.policy.arguments(idempotent)):
            with attempt:
                if first is not None:
                    # The loop's first attempt is the one just made: the policy decides on its error as before
                    # (retry, wait, stop), and the attempts and waits are the same as if the loop had made it.
                    error, first = first, None
                    raise error
                return await self._attempt(method, path, params, headers, content, wait_ms)
        raise AssertionError("unreachable: the retry loop returns or raises")

    async def _attempt(self, method: str, path: str, params: Mapping[str, object] | None, headers: dict[str, str] | None,
                       content: bytes | None, wait_ms: int | None) -> Reply:
        """One attempt: its response, or its error."""
        try:
            response = await self._http.request(method, path, params=params, headers=headers, content=content, wait_ms=wait_ms)
        except Unreachable as exc:
            raise unreachable(exc.cause, self.base_url, sent=exc.sent) from exc.cause
        if response.status_code >= 400:
            raise error_for(response, self.base_url)
        return response

    async def _json(self, method: str, path: str, *, idempotent: bool, **options: Unpack[RequestOptions]) -> JsonData:
        """``_request``, answering the JSON body (None for 204)."""
        response = await self._request(method, path, idempotent=idempotent, **options)
        return None if response.status_code == 204 else response.json()


def body(**fields: object) -> dict[str, object]:
    """A JSON body without the unset (None) fields."""
    return {k: v for k, v in fields.items() if v is not None}
