"""The errors every client raises: one hierarchy under ``mainspring.MainspringError``.

```python
from mainspring.client import InteractionsClient, NotFound, ServiceUnavailable

try:
    client.get("42")
except NotFound as exc:             # 404: exc.code == "interaction_not_found"
    ...
except ServiceUnavailable:          # the server could not be reached, or answered 502/503/504
    ...
```
``ProcessorRefused`` (502 ``processor_refused``: a machine's processor refused for good) is not a
``ServiceUnavailable``: sending the same request again cannot succeed, so no client retries it.
Every error has ``status``, ``code`` (stable: match on it) and ``detail``; ``problem()`` is the whole
problem+json answer. The classes for 404, 409… are also the server's own (``mainspring.core.errors``), so
one ``except NotFound`` serves code that calls the service in-process and code that calls it over HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import httpx

from mainspring.client.models import WorkflowRun
from mainspring.client.transports import Reply
from mainspring.core import errors as core
from mainspring.core.errors import MainspringError
from mainspring.types import JsonData, JsonInput

__all__ = [
    "ApiError", "Busy", "Cancelled", "Conflict", "Forbidden", "InvalidRequest", "InvalidURL", "LeaseLost",
    "MainspringError", "MessagesUnavailable", "NoMainspringApi", "NotFound", "ProcessorRefused", "RateLimited",
    "ServiceUnavailable", "TooLarge", "Unauthenticated", "WorkflowCancelled", "WorkflowFailed", "check_url", "error_for", "error_from_problem", "unreachable",
]

_STANDARD = ("type", "title", "status", "detail", "code")


class ApiError(MainspringError):
    """The server answered with a problem (RFC 9457)."""

    def __init__(self, status: int, problem: Mapping[str, JsonData]) -> None:
        self.status = status
        self.code = str(problem.get("code") or "http_error")
        self.title = str(problem.get("title") or "")
        detail = str(problem.get("detail") or problem.get("title") or f"HTTP {status}")
        super().__init__(detail, **{k: v for k, v in problem.items() if k not in _STANDARD})
        self._problem = dict(problem)
        self.args = (f"{status} {self.code}: {detail}",)

    def problem(self) -> dict[str, JsonInput]:
        """The problem+json body as the server sent it."""
        return dict(self._problem) or super().problem()


class InvalidRequest(ApiError, core.InvalidRequest):
    """422 (or 400): the request does not match the contract; ``problem()["errors"]`` says where."""


class Unauthenticated(ApiError, core.Unauthenticated):
    """401: no token, or one the server does not know."""


class Forbidden(ApiError, core.Forbidden):
    """403: the token's scopes do not allow this call."""


class NotFound(ApiError, core.NotFound):
    """404: ``code`` names what was not found (``interaction_not_found``, ``machine_not_found``…)."""


class NoMainspringApi(NotFound):
    """404 for the route itself: the URL is not a Mainspring server's root (``http://HOST:PORT``, without
    ``/v1``), or not a Mainspring server at all. Every missing resource has its own ``*_not_found`` code."""


class Conflict(ApiError, core.Conflict):
    """409: the call does not fit the current state (``interaction_finished``, ``busy``…)."""


class LeaseLost(Conflict, core.LeaseLost):
    """409 ``lease_lost``: another worker holds the lease now; the outcome was not stored."""


class TooLarge(ApiError, core.TooLarge):
    """413: the body is over the server's limit."""


class RateLimited(ApiError, core.RateLimited):
    """429: too many requests from this client."""


class ServiceUnavailable(ApiError, core.Unavailable):
    """The server could not be reached, or answered 502/503/504. ``sent`` is False when the request
    certainly never reached it (the connection was refused), so even an unsafe call may be sent again."""

    def __init__(self, status: int, problem: Mapping[str, JsonData], *, sent: bool = True) -> None:
        super().__init__(status, problem)
        self.sent = sent


class ProcessorRefused(ApiError):
    """502 ``processor_refused``: a machine's processor refused the request for good (it answered 422
    ``unprocessable``). Not retried: the same request would be refused again. After a Call the machine is
    ``failed`` (repair it); after a Start nothing was created; after a Repair it stays ``failed``."""


class Busy(Conflict):
    """409 ``busy``: another process holds the mailbox (``active_process_id``)."""

    @property
    def active_process_id(self) -> str | None:
        value = self._problem.get("active_process_id")
        return None if value is None else str(value)


class MessagesUnavailable(Conflict):
    """409 ``messages_unavailable``: some messages cannot be taken (``message_ids`` names them)."""

    @property
    def message_ids(self) -> list[str]:
        return [str(i) for i in cast(list[JsonData], self._problem.get("message_ids") or [])]


class Cancelled(Conflict):
    """409 ``cancelled``: the exchange process may not (or no longer) commit; roll back."""


class WorkflowFailed(MainspringError):
    """A workflow run ended ``failed`` (``WorkflowsClient.result``): ``type``, ``message`` and ``traceback`` are
    its error's; ``run`` is the run."""

    status, code, title = 409, "run_failed", "The run failed"

    def __init__(self, run: WorkflowRun) -> None:
        error = run.get("error") or {}
        super().__init__(f"run {run.get('id')!r} of {run.get('name')!r} failed: {error.get('type')}: {error.get('message')}")
        self.run = dict(run)
        self.type = error.get("type")
        self.message = error.get("message")
        self.traceback = error.get("traceback")


class WorkflowCancelled(MainspringError):
    """A workflow run was cancelled (``WorkflowsClient.result``); ``run`` is the run."""

    status, code, title = 409, "run_cancelled", "The run was cancelled"

    def __init__(self, run: WorkflowRun) -> None:
        super().__init__(f"run {run.get('id')!r} of {run.get('name')!r} was cancelled")
        self.run = dict(run)


class InteractionFailed(MainspringError):
    """The item whose result was awaited (``result``) ended ``failed``: ``error`` and ``error_detail`` are its
    (``error_detail``: the handler's exception ``type``, ``message``, ``traceback``, when it raised); ``item``
    is the item."""

    status, code, title = 409, "interaction_failed", "The interaction failed"

    def __init__(self, item: Mapping[str, object]) -> None:
        super().__init__(f"interaction {item.get('id')} of queue {item.get('queue')!r} failed: {item.get('error')}")
        self.item = dict(item)
        self.error = item.get("error")
        self.error_detail = item.get("error_detail")


class InteractionCancelled(MainspringError):
    """The item whose result was awaited (``result``) was cancelled; ``item`` is the item."""

    status, code, title = 409, "interaction_cancelled", "The interaction was cancelled"

    def __init__(self, item: Mapping[str, object]) -> None:
        super().__init__(f"interaction {item.get('id')} of queue {item.get('queue')!r} was cancelled")
        self.item = dict(item)


class ResultTimeout(MainspringError, TimeoutError):
    """``result(…, timeout_s=…)`` ran out before the item finished (a ``TimeoutError`` too); ``item`` is the
    item as it was last read."""

    status, code, title = 408, "result_timeout", "The interaction did not finish in time"

    def __init__(self, item: Mapping[str, object], timeout_s: float) -> None:
        super().__init__(f"interaction {item.get('id')} of queue {item.get('queue')!r} is still {item.get('status')} after {timeout_s} s")
        self.item = dict(item)


def result_of(item: Mapping[str, object]) -> JsonData:
    """A finished item's result, or its end raised as ``InteractionFailed`` / ``InteractionCancelled``."""
    if item["status"] == "failed":
        raise InteractionFailed(item)
    if item["status"] == "cancelled":
        raise InteractionCancelled(item)
    return cast(JsonData, item["result"])  # an item's result is JSON


class InvalidURL(MainspringError, ValueError):
    """The server URL is not ``http://…`` or ``https://…``."""

    status, code, title = 400, "invalid_url", "Invalid server URL"


_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: InvalidRequest,
    429: RateLimited,
    502: ServiceUnavailable,
    503: ServiceUnavailable,
    504: ServiceUnavailable,
    507: ServiceUnavailable,
}
_BY_CODE: dict[str, type[ApiError]] = {
    "lease_lost": LeaseLost,
    "busy": Busy,
    "messages_unavailable": MessagesUnavailable,
    "cancelled": Cancelled,
    "processor_refused": ProcessorRefused,
}


def error_for(response: Reply | httpx.Response, base_url: str | None = None) -> ApiError:
    """The error a problem answer stands for (``NoMainspringApi`` when ``base_url`` has no such route)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    problem: Mapping[str, JsonData] = body if isinstance(body, dict) else {"detail": response.text[:500] or response.reason_phrase}
    if base_url is not None and response.status_code == 404 and problem.get("code") in (None, core.NotFound.code):
        if isinstance(response, Reply):
            method, path = response.method, response.path
        else:
            method, path = response.request.method, response.request.url.path
        return NoMainspringApi(404, no_api_problem(base_url, method, path))
    return error_from_problem(response.status_code, problem)


def no_api_problem(base_url: str, method: str, path: str) -> dict[str, str]:
    """What to say when ``base_url`` has no route ``path``: it is not a Mainspring server's root."""
    url = httpx.URL(base_url)
    root = str(url.copy_with(path="/", query=None, fragment=None)).rstrip("/")
    hint = f"a server's URL is its root, here {root}" if url.path not in ("", "/") else "is it a Mainspring server?"
    return {"code": "no_mainspring_api", "title": "No Mainspring API at this URL",
            "detail": f"no Mainspring API at {base_url} (it has no {method} {path}): {hint}"}


def error_from_problem(status: int, problem: Mapping[str, JsonData]) -> ApiError:
    """The error a problem+json body with this status stands for."""
    problem = {"status": status, **problem}
    code = str(problem.get("code") or "http_error")
    kind = _BY_CODE.get(code) or _BY_STATUS.get(status) or ApiError
    return kind(status, problem)


def unreachable(exc: BaseException, url: str, *, sent: bool | None = None) -> ServiceUnavailable:
    """A transport failure (httpx's, urllib3's, aiohttp's) as the error clients raise; the transport's error
    stays its ``__cause__``. ``sent``: whether the request may have reached the server (None: an httpx error says)."""
    if sent is None:
        sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    reason = str(exc) or type(exc).__name__
    problem = {"code": "unreachable" if not sent else "no_answer", "title": "Server not reachable",
               "detail": f"{url}: {type(exc).__name__}: {reason}"}
    return ServiceUnavailable(503, problem, sent=sent)


def check_url(url: str) -> str:
    """``url`` without a trailing slash, or ``InvalidURL``."""
    parsed = httpx.URL(url) if "://" in url else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidURL(f"the server URL must look like http://HOST:PORT, got {url!r}")
    return url.rstrip("/")
