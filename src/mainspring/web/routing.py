"""Routes declared once: what each face's HTTP operations are, and how a request finds its operation.

A face lists its operations in its ``routes.py``::

    routes = Routes("/v1", tag="interactions", params={"queue": Name})

    @routes.post("/queues/{queue}/interactions", scope="queues:{queue}", body=CreateIn, answer=Interaction,
                 status=201, problems={404: "parent_not_found"})
    async def create_interaction(call: Call[CreateIn]) -> Any:
        ...

From those declarations the server builds its route table (``RouteTable``), the request path (``web.http``)
and ``/openapi.json`` (``web.openapi``): there is no other place where a route exists.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, TypeVar
from urllib.parse import unquote_to_bytes

from pydantic import StringConstraints, TypeAdapter

from mainspring.core.auth import Principal
from mainspring.core.runtime import Context
from mainspring.store import Store

BodyT = TypeVar("BodyT")
Handler = Callable[["Call[Any]"], Awaitable[Any]]

PARAM = re.compile(r"\{(\w+)\}")

# A path parameter no face declared a type for: any non-empty string without NUL, as long as a machine id.
AnySegment = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^[^\x00]+$")]


class RawBody:
    """``body=RawBody``: the operation takes the request's bytes as they are (``call.body`` is ``bytes``)."""


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer other than the operation's usual one: another status, headers, or bytes of another type."""

    content: Any = None
    status: int | None = None
    headers: Mapping[str, str] | None = None
    media_type: str | None = None
    """With ``media_type``, ``content`` is sent as it is (bytes or str) instead of as JSON."""


@dataclass(eq=False, slots=True)
class Operation:
    """One HTTP operation: method, path, who may call it, what it takes and what it answers."""

    method: str
    path: str
    handler: Handler
    tag: str
    scope: str | None = None
    """The scope the caller needs, formatted from the path parameters (``"queues:{queue}"``); without one the
    handler checks what it needs itself (any valid token gets that far)."""
    public: bool = False
    """No authentication at all (service endpoints: health, metrics, the API description)."""
    body: Any = None
    """A pydantic model the JSON body is validated into, ``RawBody`` for the bytes, or None for no body."""
    body_required: bool = True
    query: Any = None
    """A pydantic model the query string is validated into (``call.query``)."""
    answer: Any = None
    """What a success answers (a model or type; None: no content), for the API description and answer checks."""
    status: int = 200
    answers: Mapping[int, str] = field(default_factory=dict)
    """Other successes (status → description), e.g. ``{200: "already stored"}`` beside a 201."""
    problems: Mapping[int, str] = field(default_factory=dict)
    """The problems this operation answers besides the common ones (status → codes)."""
    params: Mapping[str, Any] = field(default_factory=dict)
    body_limit: Callable[[Any], int] | None = None
    """The body limit from the server's settings, when it is not ``server.max_json_bytes``."""
    content: Mapping[str, Any] | None = None
    """For raw bodies or answers, the media types the API description shows."""
    in_schema: bool = True

    @property
    def name(self) -> str:
        return self.handler.__name__

    @property
    def operation_id(self) -> str:
        """Unique in the API: the face's tag and the handler's name (``exchange_heartbeat``)."""
        return re.sub(r"\W+", "_", self.tag.lower()) + "_" + self.name

    @property
    def summary(self) -> str:
        doc = inspect.getdoc(self.handler) or ""
        return doc.split("\n\n", 1)[0].replace("\n", " ")

    @property
    def description(self) -> str:
        return inspect.getdoc(self.handler) or ""

    @property
    def param_names(self) -> list[str]:
        return PARAM.findall(self.path)


class Call(Generic[BodyT]):
    """What a handler receives: the validated request, who makes it, and the server's context."""

    __slots__ = ("_headers", "_request", "body", "ctx", "params", "principal", "query", "receive", "scope")

    def __init__(self, ctx: Context, scope: dict[str, Any], receive: Any, principal: Principal, params: dict[str, Any],
                 body: BodyT, query: Any) -> None:
        self.ctx = ctx
        self.scope = scope
        self.receive = receive
        self.principal = principal
        self.params = params
        self.body = body
        self.query = query
        self._headers: dict[str, str] | None = None
        self._request: Any = None

    @property
    def store(self) -> Store:
        return self.ctx.store

    @property
    def settings(self) -> Any:
        return self.ctx.settings

    def now_ms(self) -> int:
        return self.ctx.store.now_ms()

    def header(self, name: str) -> str | None:
        """A request header (case-insensitive), or None."""
        if self._headers is None:
            self._headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in self.scope["headers"]}
        return self._headers.get(name.lower())

    @property
    def request(self) -> Any:
        """The request as a Starlette ``Request``, for the few handlers that stream or watch the connection."""
        if self._request is None:
            from starlette.requests import Request

            self._request = Request(self.scope, self.receive)
        return self._request


class Routes:
    """A face's operations, declared with ``@routes.get(...)``, ``.post``, ``.put``, ``.patch``, ``.delete``."""

    def __init__(self, prefix: str, *, tag: str, params: Mapping[str, Any] | None = None) -> None:
        self.prefix = prefix
        self.tag = tag
        self.params = dict(params or {})
        self.operations: list[Operation] = []

    def add(self, method: str, path: str, handler: Handler, **options: Any) -> Operation:
        operation = Operation(method, self.prefix + path, handler, options.pop("tag", self.tag),
                              params={**self.params, **options.pop("params", {})}, **options)
        self.operations.append(operation)
        return operation

    def _decorator(self, method: str, path: str, options: dict[str, Any]) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.add(method, path, handler, **options)
            return handler

        return register

    def get(self, path: str, **options: Any) -> Callable[[Handler], Handler]:
        return self._decorator("GET", path, options)

    def post(self, path: str, **options: Any) -> Callable[[Handler], Handler]:
        return self._decorator("POST", path, options)

    def put(self, path: str, **options: Any) -> Callable[[Handler], Handler]:
        return self._decorator("PUT", path, options)

    def patch(self, path: str, **options: Any) -> Callable[[Handler], Handler]:
        return self._decorator("PATCH", path, options)

    def delete(self, path: str, **options: Any) -> Callable[[Handler], Handler]:
        return self._decorator("DELETE", path, options)


class PathParamError(ValueError):
    """A path segment that is not valid percent-encoded UTF-8, or that its parameter's type refuses."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


@dataclass(slots=True)
class _Compiled:
    operation: Operation
    literals: tuple[str | None, ...]
    names: tuple[str, ...]
    adapters: tuple[TypeAdapter[Any], ...]


class RouteTable:
    """Finds the operation of a request by method and path segments — a dictionary look-up and a few string
    comparisons, not a scan of every route.

    Matching is on the raw (still percent-encoded) path, and each parameter is decoded on its own, so an id
    holding ``/`` (``a%2Fb``) stays one segment."""

    def __init__(self, operations: Sequence[Operation]) -> None:
        self._by_shape: dict[tuple[str, int], list[_Compiled]] = {}
        self._methods_by_length: dict[int, list[tuple[tuple[str | None, ...], str]]] = {}
        adapters: dict[Any, TypeAdapter[Any]] = {}
        for operation in operations:
            parts = tuple(operation.path.strip("/").split("/"))
            literals = tuple(None if PARAM.fullmatch(p) else p for p in parts)
            names = tuple(PARAM.fullmatch(p).group(1) for p in parts if PARAM.fullmatch(p))  # type: ignore[union-attr]
            types = [operation.params.get(n, AnySegment) for n in names]
            compiled = _Compiled(operation, literals, names,
                                 tuple(adapters.setdefault(t, TypeAdapter(t)) for t in types))
            for method in (operation.method, "HEAD") if operation.method == "GET" else (operation.method,):
                key = (method, len(parts))
                if any(c.literals == literals for c in self._by_shape.get(key, ())):
                    raise ValueError(f"two operations for {method} {operation.path}")
                self._by_shape.setdefault(key, []).append(compiled)
            self._methods_by_length.setdefault(len(parts), []).append((literals, operation.method))
        # A literal segment wins over a parameter in the same place (``/queues/{q}/interactions/bulk``).
        for entries in self._by_shape.values():
            entries.sort(key=lambda c: [s is None for s in c.literals])

    def find(self, method: str, raw_path: bytes) -> tuple[Operation, dict[str, Any] | PathParamError] | None:
        """The operation and its decoded, validated parameters (or why one is refused); None when no operation
        has this path and method."""
        parts = raw_path.decode("latin-1").strip("/").split("/")
        for compiled in self._by_shape.get((method, len(parts)), ()):
            if all(want is None or want == got for want, got in zip(compiled.literals, parts, strict=True)):
                if any(want is None and not got for want, got in zip(compiled.literals, parts, strict=True)):
                    continue
                values = [got for want, got in zip(compiled.literals, parts, strict=True) if want is None]
                try:
                    return compiled.operation, _decode(compiled, values)
                except PathParamError as exc:
                    return compiled.operation, exc
        return None

    def allowed(self, raw_path: bytes) -> list[str]:
        """The methods that have an operation at this path (for a ``405``)."""
        parts = raw_path.decode("latin-1").strip("/").split("/")
        return sorted({method for literals, method in self._methods_by_length.get(len(parts), ())
                       if all(want is None or want == got for want, got in zip(literals, parts, strict=True))})


def _decode(compiled: _Compiled, values: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for name, adapter, value in zip(compiled.names, compiled.adapters, values, strict=True):
        try:
            text = unquote_to_bytes(value).decode("utf-8") if "%" in value else value
        except UnicodeDecodeError as exc:
            raise PathParamError(name, "not UTF-8 once percent-decoded") from exc
        try:
            params[name] = adapter.validate_python(text)
        except ValueError as exc:
            errors = getattr(exc, "errors", None)
            message = errors()[0]["msg"] if callable(errors) else str(exc)
            raise PathParamError(name, message) from exc
    return params


__all__ = ["AnySegment", "Call", "Operation", "PathParamError", "RawBody", "Reply", "RouteTable", "Routes"]
