"""HTTP plumbing shared by every route: problem+json errors, body limits, request metrics."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import Counter, Histogram
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mainspring.core.errors import InvalidRequest, MainspringError, RateLimited, TooLarge, Unavailable
from mainspring.core.logs import bind_request
from mainspring.store.errors import STORE_ERRORS, is_unavailable

log = logging.getLogger("mainspring.http")

PROBLEM = "application/problem+json"

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


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the problems a route may answer."""
    schema = Problem.model_json_schema()
    return {
        status: {"description": "A problem (RFC 9457)", "content": {PROBLEM: {"schema": schema}}}
        for status in statuses
    }


def problems_in_openapi(app: FastAPI) -> None:
    """Every documented 4xx/5xx answer is problem+json, whichever way a route declared it."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = original()
        schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = Problem.model_json_schema()
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                for status, response in operation.get("responses", {}).items():
                    if status[0] in "45":
                        response["content"] = {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}
                        response.setdefault("description", "A problem (RFC 9457)")
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


# Every /v1 route may answer these, whatever else it documents.
COMMON_PROBLEMS = problem_responses(401, 403, 413, 422, 429, 503)

_HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large", 415: "unsupported_media_type"}


def problem_response(problem: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(problem, status_code=problem["status"], media_type=PROBLEM, headers=headers)


def _clean_errors(errors: Any) -> list[dict[str, Any]]:
    # Never echo back the offending input: it may be 10 MB, binary, or a secret.
    return [{"loc": list(e.get("loc", [])), "msg": str(e.get("msg", ""))[:500], "type": e.get("type")} for e in errors]


def _validation_detail(request: Request, errors: list[dict[str, Any]]) -> str:
    """Say what is wrong: a body sent as a form (``curl -d``) is the usual mistake, not the schema."""
    content_type = request.headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    body_error = any(e["loc"][:1] == ["body"] for e in errors)
    if body_error and media and media != "application/json" and not media.endswith("+json"):
        return f"expected a JSON body, got Content-Type {media} (send Content-Type: application/json)"
    return "the request does not match the schema"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(MainspringError)
    async def _mainspring_error(_request: Request, exc: MainspringError) -> JSONResponse:
        return problem_response(exc.problem())

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _clean_errors(exc.errors())
        return problem_response(InvalidRequest(_validation_detail(request, errors), errors=errors).problem())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI answers a body it cannot parse with 400; the contract says 422 invalid_request.
        status = 422 if exc.status_code == 400 else exc.status_code
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        problem = {"type": f"https://mainspring.dev/problems/{code}", "title": str(exc.detail), "status": status, "detail": str(exc.detail), "code": code}
        if status == 422:
            problem["errors"] = [{"loc": ["body"], "msg": str(exc.detail)}]
        return problem_response(problem, headers=getattr(exc, "headers", None))

    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        if is_unavailable(exc):
            log.warning("store unavailable during %s %s: %s", request.method, request.url.path, exc)
            return problem_response(Unavailable().problem(), headers={"Retry-After": "1"})
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return problem_response({"type": "about:blank", "title": "Internal error", "status": 500, "detail": "internal error; see the server log", "code": "internal"})

    async def _client_gone(request: Request, _exc: ClientDisconnect) -> JSONResponse:
        # The client hung up while sending its body: nothing happened and nobody reads the answer.
        log.info("client went away during %s %s", request.method, request.url.path)
        return problem_response({"type": "about:blank", "title": "Client closed the request", "status": 499,
                                 "detail": "the client went away before its request was read", "code": "client_gone"})

    app.add_exception_handler(ClientDisconnect, _client_gone)  # type: ignore[arg-type]

    # Starlette re-raises whatever reaches the ``Exception`` handler (so uvicorn logs it a second time); the
    # store's own errors, the usual ones while a database restarts, are handled one level further in.
    for error_class in (*STORE_ERRORS, Exception):
        app.add_exception_handler(error_class, _unexpected)  # type: ignore[arg-type]


class BodyLimitMiddleware:
    """Refuse bodies over the limit with ``413 too_large`` before a route reads them.

    ``limits`` maps (method, path regex) to a byte limit; everything else gets ``default``.
    """

    def __init__(self, app: ASGIApp, default: int, limits: list[tuple[str, str, int]] | None = None) -> None:
        self.app = app
        self.default = default
        self.limits = [(m, re.compile(p), n) for m, p, n in (limits or [])]

    def limit_for(self, scope: Scope) -> int:
        for method, pattern, limit in self.limits:
            if scope["method"] == method and pattern.fullmatch(scope["path"]):
                return limit
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _send_too_large(send, limit)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise TooLarge(f"request body over {limit} bytes")
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except TooLarge:
            if not started:
                await _send_too_large(send, limit)


async def _send_too_large(send: Send, limit: int) -> None:
    body = TooLarge(f"request body over {limit} bytes").problem()
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", PROBLEM.encode()), (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})


REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class RequestIdMiddleware:
    """``X-Request-Id``: the caller's (when it is a plain token) or a new one, on every log line of the
    request and echoed in the answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        bind_request(scope, request_id)
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", "unmatched")
            HTTP_REQUESTS.labels(scope["method"], path, str(status)).inc()
            HTTP_LATENCY.labels(scope["method"], path).observe(time.perf_counter() - started)


class RateLimitMiddleware:
    """Per-client request rate limit on ``/v1`` (a moving window in this server's memory).

    A client is its bearer token (hashed) or, without one, its address. It protects one server from a
    flood; limits that must hold across servers (queue rate limits) live in the store instead.
    """

    def __init__(self, app: ASGIApp, rate: str) -> None:
        from limits import parse
        from limits.storage import MemoryStorage
        from limits.strategies import MovingWindowRateLimiter

        self.app = app
        self.rate = parse(rate)
        self.limiter = MovingWindowRateLimiter(MemoryStorage())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization")
        client = hashlib.sha256(auth).hexdigest() if auth else str((scope.get("client") or ("?",))[0])
        if not self.limiter.hit(self.rate, client):
            reset = self.limiter.get_window_stats(self.rate, client).reset_time
            retry_after = max(1, int(reset - time.time() + 0.999))
            body = json.dumps(RateLimited(f"over {self.rate}").problem()).encode()
            await send({"type": "http.response.start", "status": 429, "headers": [(b"content-type", PROBLEM.encode()), (b"retry-after", str(retry_after).encode()), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
