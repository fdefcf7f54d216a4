"""Routes declared once: what each face's HTTP operations are, and how a request finds its operation.

A face lists its operations in its ``routes.py``::

    routes = Routes("/v1", tag="interactions")

    @routes.post("/queues/{queue}/interactions", permission=Scope("queues:{queue}"), status=201,
                 problems=[ParentNotFound])
    async def create_interaction(call: Call, queue: Name, body: CreateIn) -> Interaction | Reply:
        ...

The signature declares the rest: ``queue`` is the path parameter (validated as a ``Name``), ``body`` the JSON
body, the return annotation the answer. An operation without ``permission=`` is refused at import.

From those declarations the server builds its route table (``RouteTable``), the request path (``web.http``)
and ``/openapi.json`` (``web.openapi``): there is no other place where a route exists.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import UnionType
from typing import Annotated, Any, TypedDict, TypeVar, Union, Unpack, get_args, get_origin, get_type_hints
from urllib.parse import unquote_to_bytes

from pydantic import StringConstraints, TypeAdapter
from pydantic_core import to_json
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope

from mainspring.core.auth import Principal
from mainspring.core.errors import MainspringError
from mainspring.core.runtime import Context
from mainspring.store import Store
from mainspring.web.permissions import Permission

Handler = Callable[..., Awaitable[object]]
H = TypeVar("H", bound=Handler)

PARAM = re.compile(r"\{(\w+)\}")
Params = dict[str, object]
"""Path parameters by name, validated by their declared types."""

# A path parameter no face declared a type for: any non-empty string without NUL, as long as a machine id.
AnySegment = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^[^\x00]+$")]


class RawBody:
    """``body=RawBody``: the operation takes the request's bytes as they are (``call.body`` is ``bytes``)."""


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer other than the operation's usual one: another status, headers, or bytes of another type."""

    content: object = None
    status: int | None = None
    headers: Mapping[str, str] | None = None
    media_type: str | None = None
    """With ``media_type``, ``content`` is sent as it is (bytes or str) instead of as JSON."""


@dataclass(frozen=True, slots=True)
class AsDeclared:
    """An answer already in its declared type's shape, made by the one function that makes that shape (an
    interaction's ``to_api``): sent as JSON straight away, without validating it into the type's models first —
    for 50 leased items that validation cost more than the rest of the answer. The declared type still
    describes it in ``/openapi.json``, and ``server.check_answers`` (the tests) still checks it field by field."""

    value: object


@dataclass(eq=False, slots=True)
class Operation:
    """One HTTP operation: method, path, who may call it, what it takes and what it answers.

    What it takes and answers comes from the handler's signature: a parameter named like a path parameter
    is that parameter (its annotation validates it), ``body`` the JSON body (``X | None``: optional),
    ``query`` the query string's model, ``call`` the ``Call``; the return annotation is the answer
    (``X | Reply`` when it may answer otherwise, ``None`` for no content)."""

    method: str
    path: str
    handler: Handler
    tag: str
    permission: Permission
    body: Any = None
    """A pydantic model the JSON body is validated into, ``RawBody`` for the bytes, or None for no body."""
    body_required: bool = True
    query: Any = None
    """A pydantic model the query string is validated into."""
    answer: Any = None
    """What a success answers (a model or type; None: no content): the API description, and ``encode``."""
    status: int = 200
    answers: Mapping[int, str] = field(default_factory=dict)
    """Other successes (status → description), e.g. ``{200: "already stored"}`` beside a 201."""
    problems: Sequence[type[MainspringError]] = ()
    """The errors this operation may answer besides the common ones (each carries its status and code)."""
    params: Mapping[str, Any] = field(default_factory=dict)
    arguments: tuple[str, ...] = ()
    """The handler's parameters, in order."""
    body_limit: Callable[[Any], int] | None = None
    """The body limit from the server's settings, when it is not ``server.max_json_bytes``."""
    content: Mapping[str, object] | None = None
    """For raw bodies or answers, the media types the API description shows."""
    in_schema: bool = True
    encode: Callable[[object], bytes] = to_json
    """The answer's JSON as its declared type makes it (``answer``), compiled once when the operation is declared."""

    @property
    def public(self) -> bool:
        return self.permission.public

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

    def invoke(self, call: Call) -> Awaitable[object]:
        values = {"call": call, "body": call.body, "query": call.query}
        return self.handler(*[values[a] if a in values else call.params[a] for a in self.arguments])


class Call:
    """What a handler receives: who makes the request, its headers, and the server's context."""

    __slots__ = ("_headers", "_request", "body", "ctx", "params", "principal", "query", "receive", "scope")

    def __init__(self, ctx: Context, scope: Scope, receive: Receive, principal: Principal, params: Params,
                 body: object, query: object) -> None:
        self.ctx = ctx
        self.scope = scope
        self.receive = receive
        self.principal = principal
        self.params = params
        self.body = body
        self.query = query
        self._headers: dict[str, str] | None = None
        self._request: Request | None = None

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
    def request(self) -> Request:
        """The request as a Starlette ``Request``, for the few handlers that stream or watch the connection."""
        if self._request is None:
            self._request = Request(self.scope, self.receive)
        return self._request


class MissingPermission(TypeError):
    """An operation declared without ``permission=``: refused when its module is imported."""


def _without(annotation: Any, *dropped: Any) -> tuple[Any, bool]:
    """``annotation`` without the ``dropped`` members of its union; and whether any was there."""
    if get_origin(annotation) in (Union, UnionType):
        members = get_args(annotation)
        kept = [m for m in members if m not in dropped]
        if len(kept) < len(members):
            return (kept[0] if len(kept) == 1 else Union[tuple(kept)]), True  # noqa: UP007 - built at run time
    return annotation, False


def _declared(handler: Handler, path: str) -> dict[str, Any]:
    """What the handler's signature declares: path parameter types, body, query and answer."""
    hints = get_type_hints(handler, include_extras=True)
    arguments = tuple(inspect.signature(handler).parameters)
    in_path = PARAM.findall(path)
    found: dict[str, Any] = {"arguments": arguments, "params": {}}
    for argument in arguments:
        if argument in ("call",):
            continue
        if argument not in hints:
            raise TypeError(f"{handler.__name__}: parameter {argument} has no type")
        if argument == "body":
            found["body"], optional = _without(hints["body"], type(None))
            found["body_required"] = not optional
            if found["body"] is bytes:
                found["body"] = RawBody
        elif argument == "query":
            found["query"] = hints["query"]
        elif argument in in_path:
            found["params"][argument] = hints[argument]
        else:
            raise TypeError(f"{handler.__name__}: parameter {argument} is neither a path parameter, body nor query")
    untyped = [name for name in in_path if name not in found["params"]]
    if untyped:
        raise TypeError(f"{handler.__name__}: path parameters {', '.join(untyped)} are not in its signature")
    answer, _ = _without(hints.get("return"), Reply, AsDeclared)
    # An ASGI response (a stream, a file) sends itself: the operation declares its media types in ``content``.
    sends_itself = isinstance(answer, type) and issubclass(answer, Response)
    found["answer"] = None if sends_itself or answer in (None, type(None), Reply, Any) else answer
    return found


def answer_encoder(answer: Any) -> Callable[[object], bytes]:
    """Encodes a value as the declared answer type: its fields, names and types, nothing else.

    The type's serializer is compiled here, once, at import. A value of the declared model is dumped as it is;
    any other value (a list of models, a mapping) goes through the declared type first, so what is sent is
    what ``/openapi.json`` describes — a field the type does not declare is not sent, one it needs and the value
    lacks is a server error, never a silently different answer."""
    adapter: TypeAdapter[Any] = TypeAdapter(answer)
    model = answer if isinstance(answer, type) else None
    dump = functools.partial(adapter.dump_json, by_alias=True)

    def encode(value: object) -> bytes:
        if isinstance(value, AsDeclared):
            return to_json(value.value)
        if model is None or not isinstance(value, model):
            value = adapter.validate_python(value)
        return dump(value)

    return encode


class OperationOptions(TypedDict, total=False):
    """What an operation may declare besides its handler's signature (``Operation``'s fields of the same names)."""

    tag: str
    status: int
    answers: Mapping[int, str]
    problems: Sequence[type[MainspringError]]
    body_limit: Callable[[Any], int] | None
    content: Mapping[str, object] | None
    in_schema: bool


class RouteOptions(OperationOptions, total=False):
    """``OperationOptions`` and who may call the operation."""

    permission: Permission | None


class Routes:
    """A face's operations, declared with ``@routes.get(...)``, ``.post``, ``.put``, ``.patch``, ``.delete``."""

    def __init__(self, prefix: str, *, tag: str) -> None:
        self.prefix = prefix
        self.tag = tag
        self.operations: list[Operation] = []

    def add(self, method: str, path: str, handler: Handler, *, permission: Permission | None = None,
            **options: Unpack[OperationOptions]) -> Operation:
        if not isinstance(permission, Permission):
            raise MissingPermission(f"{method} {self.prefix + path} ({handler.__name__}) declares no permission: "
                                    "every operation says who may call it (web.permissions)")
        declared = _declared(handler, self.prefix + path)
        declared.update(options)
        if declared.get("answer") is not None:
            declared["encode"] = answer_encoder(declared["answer"])
        operation = Operation(method, self.prefix + path, handler, declared.pop("tag", self.tag), permission, **declared)
        self.operations.append(operation)
        return operation

    def _decorator(self, method: str, path: str, options: RouteOptions) -> Callable[[H], H]:
        def register(handler: H) -> H:
            self.add(method, path, handler, **options)
            return handler

        return register

    def get(self, path: str, **options: Unpack[RouteOptions]) -> Callable[[H], H]:
        return self._decorator("GET", path, options)

    def post(self, path: str, **options: Unpack[RouteOptions]) -> Callable[[H], H]:
        return self._decorator("POST", path, options)

    def put(self, path: str, **options: Unpack[RouteOptions]) -> Callable[[H], H]:
        return self._decorator("PUT", path, options)

    def patch(self, path: str, **options: Unpack[RouteOptions]) -> Callable[[H], H]:
        return self._decorator("PATCH", path, options)

    def delete(self, path: str, **options: Unpack[RouteOptions]) -> Callable[[H], H]:
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
    fixed: tuple[tuple[int, str], ...] = ()
    """The literal segments with their places: what a path must have to be this operation's."""
    slots: tuple[int, ...] = ()
    """The places of the parameters, in ``names``' order."""

    def __post_init__(self) -> None:
        self.fixed = tuple((i, want) for i, want in enumerate(self.literals) if want is not None)
        self.slots = tuple(i for i, want in enumerate(self.literals) if want is None)


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

    def find(self, method: str, raw_path: bytes) -> tuple[Operation, Params | PathParamError] | None:
        """The operation and its decoded, validated parameters (or why one is refused); None when no operation
        has this path and method."""
        parts = raw_path.decode("latin-1").strip("/").split("/")
        # Every request passes here: index look-ups, no generator per candidate.
        for compiled in self._by_shape.get((method, len(parts)), ()):
            for i, want in compiled.fixed:
                if parts[i] != want:
                    break
            else:
                values = [parts[i] for i in compiled.slots]
                if not all(values):
                    continue  # an empty segment is no parameter's value
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


def _decode(compiled: _Compiled, values: list[str]) -> Params:
    params: Params = {}
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


__all__ = ["AnySegment", "AsDeclared", "Call", "MissingPermission", "Operation", "PathParamError", "RawBody", "Reply", "RouteTable", "Routes"]
