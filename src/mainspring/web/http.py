"""The request path of every declared operation: one ASGI entry does what a stack of middlewares and
dependency injection did — request id, body limit, authentication and scope, validation, the handler,
problem+json errors, request metrics — once per request, with everything that can be prepared prepared.

A 2xx is sent only after the handler returned, so it still means what the handler committed is committed.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast
from urllib.parse import parse_qsl

from prometheus_client import Counter, Histogram
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails, to_json
from starlette.types import Message, Receive, Scope, Send

from mainspring.core.auth import OPEN, Authenticator
from mainspring.core.errors import (
    InvalidRequest,
    MainspringError,
    NotFound,
    RateLimited,
    RequestTimeout,
    TooLarge,
    Unavailable,
    UnsupportedMediaType,
)
from mainspring.core.logs import bind_request
from mainspring.core.runtime import Context
from mainspring.core.types import check_media_type
from mainspring.store.errors import is_unavailable
from mainspring.types import JsonInput
from mainspring.web.guard import check_browser_request
from mainspring.web.routing import (
    AsDeclared,
    Call,
    Operation,
    Params,
    PathParamError,
    RawBody,
    Reply,
    RouteTable,
)

log = logging.getLogger("mainspring.http")

PROBLEM = "application/problem+json"
_JSON = [(b"content-type", b"application/json")]
_PROBLEM = [(b"content-type", PROBLEM.encode())]

HTTP_REQUESTS = Counter("mainspring_http_requests_total", "HTTP requests answered", ["method", "route", "status"])
HTTP_LATENCY = Histogram(
    "mainspring_http_request_seconds",
    "HTTP request latency",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


class Problem(BaseModel):
    """RFC 9457 problem details; ``code`` is stable and is what clients match on."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    code: str


class ClientGone(Exception):
    """The client hung up while its request was being read."""


def _problem(status: int, code: str, title: str, detail: str, **extra: JsonInput) -> dict[str, JsonInput]:
    return {"type": f"https://mainspring.dev/problems/{code}", "title": title, "status": status, "detail": detail,
            "code": code, **extra}


def _clean_errors(errors: Iterable[ErrorDetails], prefix: tuple[str, ...]) -> list[dict[str, JsonInput]]:
    # Never echo back the offending input: it may be 10 MB, binary, or a secret.
    return [{"loc": [*prefix, *e.get("loc", ())], "msg": str(e.get("msg", ""))[:500], "type": e.get("type")} for e in errors]


def _invalid(errors: list[dict[str, JsonInput]], detail: str = "the request does not match the schema") -> InvalidRequest:
    return InvalidRequest(detail, errors=errors)


def _media(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _is_json(media: str) -> bool:
    return not media or media == "application/json" or media.endswith("+json")


class _Metrics:
    """Request metrics with the label children looked up once per (operation, status)."""

    def __init__(self) -> None:
        self._counters: dict[tuple[str, str, int], Counter] = {}
        self._latencies: dict[tuple[str, str], Histogram] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        counter = self._counters.get((method, route, status))
        if counter is None:
            counter = self._counters[(method, route, status)] = HTTP_REQUESTS.labels(method, route, str(status))
        latency = self._latencies.get((method, route))
        if latency is None:
            latency = self._latencies[(method, route)] = HTTP_LATENCY.labels(method, route)
        counter.inc()
        latency.observe(seconds)


class _RateLimit:
    """Per-client request rate on ``/v1`` (a moving window in this server's memory). A client is its valid
    token (its sha256, however the header writes it) or else its address — so unknown tokens, which cost a
    lookup each, are limited with the address they come from. It protects one server from a flood; limits
    that must hold across servers (queue rate limits) live in the store instead."""

    def __init__(self, rate: str) -> None:
        from limits import parse
        from limits.storage import MemoryStorage
        from limits.strategies import MovingWindowRateLimiter

        self.rate = parse(rate)
        self.limiter = MovingWindowRateLimiter(MemoryStorage())

    def check(self, scope: Scope, token_sha256: str | None) -> None:
        client = f"token:{token_sha256}" if token_sha256 else f"address:{(scope.get('client') or ('?',))[0]}"
        if not self.limiter.hit(self.rate, client):
            reset = self.limiter.get_window_stats(self.rate, client).reset_time
            raise RateLimited(f"over {self.rate}", retry_after=max(1, int(reset - time.time() + 0.999)))


class Api:
    """Serves the declared operations. ``find`` tells whether a request is one of them; ``serve`` answers it."""

    def __init__(self, ctx: Context, authenticator: Authenticator, operations: list[Operation], *,
                 max_json_bytes: int, rate_limit: str | None = None, check_answers: bool = False) -> None:
        self.ctx = ctx
        self.authenticator = authenticator
        self.operations = operations
        self.table = RouteTable(operations)
        self.max_json_bytes = max_json_bytes
        self.rate_limit = _RateLimit(rate_limit) if rate_limit else None
        self.check_answers = check_answers
        self.metrics = _Metrics()
        self._body_limits = {op: op.body_limit(ctx.settings) if op.body_limit else max_json_bytes for op in operations}
        self._answer_checks: dict[Operation, Callable[[object], None]] = {}
        self._body_validators = {op: _json_validator(op.body) for op in operations if op.body not in (None, RawBody)}

    async def serve(self, operation: Operation, params: Params | PathParamError, scope: Scope, receive: Receive,
                    send: Send) -> None:
        started = time.perf_counter()
        method = scope["method"]
        request_id = _request_id(scope)
        bind_request(scope, request_id)
        scope["route_path"] = operation.path
        if isinstance(params, dict):
            scope["path_params"] = params
        sent: list[int] = []

        async def send_marked(message: Message) -> None:
            if message["type"] == "http.response.start":
                sent.append(message["status"])
                # nosniff: a body goes out as its declared type (a message's HTML stays text to a browser).
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", request_id.encode()),
                                      (b"x-content-type-options", b"nosniff")]
            await send(message)

        status = 500
        try:
            status = await self._answer(operation, params, scope, receive, send_marked)
        except BaseException:
            # Cancelled (the server stopping, the client gone under a stream): count it as what was sent.
            status = sent[0] if sent else 499
            raise
        finally:
            self.metrics.observe(method, operation.path, status, time.perf_counter() - started)

    async def _answer(self, operation: Operation, params: Params | PathParamError, scope: Scope, receive: Receive,
                      send: Send) -> int:
        """Run the operation and send its answer; answers the status sent."""
        try:
            authorization = _header(scope, b"authorization")
            if self.rate_limit is not None and not operation.public:
                self.rate_limit.check(scope, self.authenticator.known_token(authorization))
            limit = self._body_limits[operation]
            declared = _header(scope, b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                return await _send_problem(send, TooLarge(f"request body over {limit} bytes").problem(), close=True)
            principal = OPEN if operation.public else await self.authenticator.authenticate(authorization)
            if not operation.public:
                check_browser_request(scope, self.ctx.settings.server, open_server=principal.open)
            if isinstance(params, PathParamError):
                raise _invalid([{"loc": ["path", params.name], "msg": str(params)}], f"path parameter {params.name}: {params}")
            query = _query(operation, scope) if operation.query is not None else None
            permission = operation.permission
            if not principal.open:
                permission.before_body(principal, {**(dict(query) if query is not None else {}), **params})
            body = await self._body(operation, scope, receive, limit) if operation.body is not None else None
            call = Call(self.ctx, scope, receive, principal, params, body, query)
            if not principal.open:
                await permission.after_body(call)
            result = await operation.invoke(call)
            if not principal.open:
                result = permission.filter(principal, result)
            return await self._send_result(operation, result, scope, receive, send)
        except MainspringError as exc:
            headers = {"Retry-After": str(exc.extra.pop("retry_after"))} if "retry_after" in exc.extra else None
            # A body refused half-read leaves the rest on the wire: the connection cannot carry another request.
            return await _send_problem(send, exc.problem(), headers=headers, close=isinstance(exc, (TooLarge, RequestTimeout)))
        except ClientGone:
            # Nothing happened and nobody reads the answer.
            log.info("client went away during %s %s", scope["method"], scope["path"])
            return await _send_problem(send, _problem(499, "client_gone", "Client closed the request",
                                                      "the client went away before its request was read"))
        except Exception as exc:
            if is_unavailable(exc):
                log.warning("store unavailable during %s %s: %s", scope["method"], scope["path"], exc)
                return await _send_problem(send, Unavailable().problem(), headers={"Retry-After": "1"})
            log.exception("unexpected error in %s %s", scope["method"], scope["path"])
            return await _send_problem(send, _problem(500, "internal", "Internal error", "internal error; see the server log"))

    async def _body(self, operation: Operation, scope: Scope, receive: Receive, limit: int) -> object:
        raw = await _read_body(receive, limit, self.ctx.settings.server.body_timeout_ms / 1000)
        if operation.body is RawBody:
            return raw
        if not raw:
            if operation.body_required:
                raise _invalid([{"loc": ["body"], "msg": "Field required", "type": "missing"}])
            return None
        media = _media(_header(scope, b"content-type"))
        if not _is_json(media):
            # A browser's form or text/plain body is how another site writes without a preflight.
            raise UnsupportedMediaType(f"expected a JSON body, got Content-Type {media[:100]} (send Content-Type: application/json)")
        validate = self._body_validators[operation]
        try:
            return validate(raw)
        except ValidationError as exc:
            error = exc
        integral = _integral_floats(raw, error)
        if integral is not None:
            try:
                return validate(integral)
            except ValidationError as exc:
                error = exc
        raise _invalid(_clean_errors(error.errors(include_input=False), ("body",))) from None

    async def _send_result(self, operation: Operation, result: object, scope: Scope, receive: Receive, send: Send) -> int:
        status = operation.status
        headers: list[tuple[bytes, bytes]] = _JSON
        if isinstance(result, Reply):
            status = result.status or status
            extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (result.headers or {}).items()]
            if result.media_type is not None:
                content = result.content
                raw = content if isinstance(content, bytes) else content.encode() if isinstance(content, str) else to_json(content)
                return await _send(send, status, raw, [(b"content-type", _sendable(result.media_type)), *extra])
            headers = [*_JSON, *extra]
            result = result.content
        elif callable(result) and not isinstance(result, (BaseModel, dict, list)):
            # An ASGI response (a stream of server-sent events, a file): it sends itself.
            await result(scope, receive, send)
            return getattr(result, "status_code", status)
        if status == 204 or (operation.answer is None and result is None):
            return await _send(send, status, b"", [])
        if status != operation.status and status not in operation.answers:
            # An answer the operation does not declare (a stored processor's 4xx replayed): sent as it is.
            return await _send(send, status, to_json(result), headers)
        plain = result.value if isinstance(result, AsDeclared) else result
        if self.check_answers:
            self._check_answer(operation, status, plain)
        try:
            encoded = operation.encode(result)
        except ValidationError as exc:
            raise TypeError(f"{operation.method} {operation.path} answered a value that is not its declared "
                            f"{operation.answer}: {exc}") from None
        if self.check_answers and json.loads(encoded) != json.loads(to_json(plain)):
            raise AssertionError(f"{operation.method} {operation.path}: its declared type sent {encoded!r} for {result!r}")
        return await _send(send, status, encoded, headers)

    def _check_answer(self, operation: Operation, status: int, result: object) -> None:
        """Tests only (``server.check_answers``): the answer is exactly what the API description says — no field
        missing, none extra, no value of another type — and what the handler returned is what was sent (the
        declared type dropped nothing it had)."""
        if operation.answer is None or status not in (operation.status, *operation.answers):
            return
        check = self._answer_checks.get(operation)
        if check is None:
            adapter: TypeAdapter[Any] = TypeAdapter(operation.answer)

            def check(value: object) -> None:
                sent = json.loads(to_json(value))
                try:
                    expected = adapter.dump_python(adapter.validate_python(sent), mode="json", by_alias=True)
                except ValidationError as exc:
                    raise AssertionError(f"{operation.method} {operation.path} answered {sent!r}: {exc}") from None
                if sent != expected:
                    raise AssertionError(f"{operation.method} {operation.path} answered {sent!r}, its schema makes it {expected!r}")

            self._answer_checks[operation] = check
        check(result)


def _sendable(media_type: str) -> bytes:
    """A media type as a header value; one that is not a valid media type (stored before they were checked)
    goes out as bytes, never as a broken header or a 500."""
    try:
        return check_media_type(media_type).encode("ascii")
    except ValueError:
        return b"application/octet-stream"


def _json_validator(body: Any) -> Callable[[bytes], Any]:
    # Strict: JSON ``false`` is not the integer 0, nor ``"5"`` the integer 5 (a JSON body has real types;
    # only query strings and paths are text to be converted).
    if isinstance(body, type) and issubclass(body, BaseModel):
        return functools.partial(body.model_validate_json, strict=True)
    return functools.partial(TypeAdapter(body).validate_json, strict=True)


def _integral_floats(raw: bytes, error: ValidationError) -> bytes | None:
    """The body again with each number that the strict validation refused as an integer but that is one
    (``12.0``) written as that integer; None when there is none.

    JSON Schema calls ``12.0`` an integer (a number with no fractional part), so a client that writes it so
    sends a valid request; strict validation, kept for the rest (``false`` is not 0, nor ``"5"`` 5), does not
    see it that way. Only the places the errors name change — a ``12.0`` inside free JSON (``data``) stays a
    float — and only once a request was refused, so a valid body costs nothing more."""
    places = [e["loc"] for e in error.errors() if e["type"] == "int_type" and type(e.get("input")) is float
              and e["input"].is_integer()]
    if not places:
        return None
    try:
        document = json.loads(raw)
    except ValueError:
        return None
    changed = False
    for loc in places:
        parent: Any = None
        key: Any = None
        node: Any = document
        for part in loc:
            if isinstance(node, dict) and part in node:
                parent, key, node = node, part, node[part]
            elif isinstance(node, list) and isinstance(part, int) and -len(node) <= part < len(node):
                parent, key, node = node, part, node[part]
            elif isinstance(node, dict | list):
                break  # a union member's tag where a value was expected: not a place in the document
            # else: a union member's tag after the value (``parent_id`` → ``int``): the value is found
        else:
            if parent is not None and type(node) is float and node.is_integer():
                parent[key] = int(node)
                changed = True
    return json.dumps(document).encode() if changed else None


def _request_id(scope: Scope) -> str:
    """The caller's ``X-Request-Id`` when it is a plain token, else a new one."""
    given = _header(scope, b"x-request-id")
    if given and len(given) <= 128 and given.replace("-", "").replace(".", "").replace(":", "").replace("_", "").isalnum() and given.isascii():
        return given
    return os.urandom(16).hex()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None


def _query(operation: Operation, scope: Scope) -> BaseModel:
    raw = scope.get("query_string", b"")
    values = dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True)) if raw else {}
    try:
        query: BaseModel = operation.query.model_validate(values)
        return query
    except ValidationError as exc:
        raise _invalid(_clean_errors(exc.errors(include_input=False), ("query",))) from None


async def _read_body(receive: Receive, limit: int, timeout_s: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            # asyncio.timeout, not wait_for: wait_for (3.11) wraps each receive in a task of its own, which cost
            # the request path more than reading the body.
            async with asyncio.timeout(timeout_s):
                message = await receive()
        except TimeoutError:
            raise RequestTimeout(f"no byte of the request body for {timeout_s:g} s") from None
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"request body over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
    return status


async def _send_problem(send: Send, problem: Mapping[str, JsonInput], *, headers: Mapping[str, str] | None = None, close: bool = False) -> int:
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    if close:
        extra.append((b"connection", b"close"))
    return await _send(send, cast(int, problem["status"]), to_json(problem), [*_PROBLEM, *extra])


async def send_problem(scope: Scope, send: Send, status: int, code: str, title: str, detail: str, *,
                       headers: Mapping[str, str] | None = None) -> None:
    """A problem for a request no operation answers (no such path, a method not allowed)."""
    await _send_problem(send, _problem(status, code, title, detail), headers=headers)


def not_found(path: str) -> NotFound:
    return NotFound(f"no operation at {path}")


__all__ = ["PROBLEM", "Api", "Problem", "send_problem"]
