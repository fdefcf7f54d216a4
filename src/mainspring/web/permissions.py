"""Who may call an operation, declared beside its path: the route table refuses an operation without one.

Each kind says where the scope comes from:

- ``Scope("queues:{queue}")``: a template over the path parameters (and the query's fields); several
  templates mean any of them. A template naming a field the request left out is skipped
  (``Scope("exchange:receive:{addressee}", "admin")``: ``admin`` unless an addressee is named).
- ``Owned(load, scope_of, hidden)``: the object the path's id names is loaded and names its scope (an item's
  queue, a schedule's stored queue, a process's receiver, a package's batcher). An object outside the token's
  scopes is answered ``hidden(id)`` — the very problem an unknown id gets — so existence does not leak.
- ``Referenced(ids, load, scope_of, hidden)``: body fields naming other objects (a ``parent_id``) must name
  objects the token may touch; ``InBody(scopes)``: body fields that name a scope themselves (a schedule's new
  ``queue``, a reply's addressee).
- ``Filtered(field, scope_of)``: a list answer keeps only the entries the token may see.
- ``All(...)``: every one of them; ``PUBLIC``: no token at all (health, metrics, the API description).

Handlers never check permission themselves: the request path (``web.http``) runs ``before_body`` once the
token is known, ``after_body`` once the body is validated, and ``filter`` on the handler's answer.
"""

from __future__ import annotations

import string
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

from mainspring.core.auth import Principal
from mainspring.core.errors import Forbidden, MainspringError
from mainspring.core.runtime import Context

if TYPE_CHECKING:
    from mainspring.web.routing import Call

T = TypeVar("T")
Values = Mapping[str, object]


def unlimited(principal: Principal) -> bool:
    """An open server or an ``admin`` token: nothing to load, every object is in scope."""
    return principal.open or "admin" in principal.scopes


def holds_under(principal: Principal, prefix: str) -> bool:
    """Whether the token holds any scope under ``prefix`` (``exchange:receive:`` for some addressee)."""
    return unlimited(principal) or any(g.startswith(prefix) or (g.endswith("*") and prefix.startswith(g[:-1]))
                                       for g in principal.scopes)


class Permission:
    """What an operation requires; every kind answers ``describe`` for the API description."""

    public = False

    def describe(self) -> str:
        raise NotImplementedError

    def problems(self) -> Sequence[type[MainspringError]]:
        """The problems this permission answers besides ``403 forbidden`` (a hidden object's ``404``)."""
        return ()

    def before_body(self, principal: Principal, values: Values) -> None:
        """Checks that need only the token and the path and query (before the body is read)."""

    async def after_body(self, call: Call) -> None:
        """Checks that load objects or look at the body."""

    def filter(self, principal: Principal, answer: object) -> object:
        return answer


class _Public(Permission):
    public = True

    def describe(self) -> str:
        return "public"


PUBLIC: Permission = _Public()


def _fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


@dataclass(frozen=True, init=False)
class Scope(Permission):
    templates: tuple[str, ...]

    def __init__(self, *templates: str) -> None:
        if not templates:
            raise ValueError("Scope needs at least one template")
        object.__setattr__(self, "templates", templates)

    def describe(self) -> str:
        return " or ".join(self.templates)

    def required(self, values: Values) -> list[str]:
        return [t.format(**values) for t in self.templates if all(values.get(f) is not None for f in _fields(t))]

    def before_body(self, principal: Principal, values: Values) -> None:
        scopes = self.required(values)
        if not any(principal.allows(s) for s in scopes):
            raise Forbidden(f"this token does not have scope {' or '.join(map(repr, scopes))}")


@dataclass(frozen=True)
class Owned(Permission, Generic[T]):
    """The object named by the path parameter ``param``, loaded to name its scope."""

    param: str
    load: Callable[[Context, str], Awaitable[T | None]]
    """The object, or None when there is none."""
    scope_of: Callable[[T], str]
    hidden: Callable[[str], MainspringError]
    """The problem an unknown id is answered (the operation's own ``404``); an object outside the token's
    scopes is answered the same."""
    unknown: Callable[[Principal], bool] | None = None
    """Whether an unknown id goes on to the handler for this token (an operation that answers unknown ids
    itself, e.g. API_4's alert); by default an unknown id is answered ``hidden``."""
    shown_as: str = ""

    def describe(self) -> str:
        return self.shown_as or f"the scope of the object {{{self.param}}}"

    def problems(self) -> Sequence[type[MainspringError]]:
        return (type(self.hidden("x")),)

    async def after_body(self, call: Call) -> None:
        principal = call.principal
        if unlimited(principal):
            return
        key = str(call.params[self.param])
        found = await self.load(call.ctx, key)
        if found is None:
            if self.unknown is not None and self.unknown(principal):
                return
            raise self.hidden(key)
        if not principal.allows(self.scope_of(found)):
            raise self.hidden(key)


@dataclass(frozen=True)
class Referenced(Permission, Generic[T]):
    """Ids in the body that name other objects; each must be one the token may touch, or the request is
    answered as if it named no object."""

    ids: Callable[[object], Iterable[str | None]]
    load: Callable[[Context, str], Awaitable[T | None]]
    scope_of: Callable[[T], str]
    hidden: Callable[[str], MainspringError]
    shown_as: str = ""

    def describe(self) -> str:
        return self.shown_as

    def problems(self) -> Sequence[type[MainspringError]]:
        return (type(self.hidden("x")),)

    async def after_body(self, call: Call) -> None:
        if unlimited(call.principal) or call.body is None:
            return
        for key in dict.fromkeys(k for k in self.ids(call.body) if k is not None):
            found = await self.load(call.ctx, key)
            if found is not None and not call.principal.allows(self.scope_of(found)):
                raise self.hidden(key)


@dataclass(frozen=True)
class InBody(Permission):
    """Scopes named by the body itself (the queue a schedule is moved to, the addressee of a reply)."""

    scopes: Callable[[object], Iterable[str]]
    shown_as: str

    def describe(self) -> str:
        return self.shown_as

    async def after_body(self, call: Call) -> None:
        if call.body is None:
            return
        for scope in self.scopes(call.body):
            call.principal.require(scope)


@dataclass(frozen=True)
class Filtered(Permission):
    """Every valid token; the answer's list ``field`` keeps only the entries whose scope the token holds."""

    field: str
    scope_of: Callable[[Any], str]
    """The scope of one entry of the answer's list (an entry is a model of the declared answer)."""
    shown_as: str

    def describe(self) -> str:
        return f"any token; only the entries of {self.shown_as} it holds"

    def filter(self, principal: Principal, answer: object) -> object:
        if unlimited(principal):
            return answer
        # Fail closed: an answer this cannot filter is an error, never sent unfiltered.
        if not isinstance(answer, BaseModel):
            raise TypeError(f"a Filtered answer is a model with the list {self.field!r}, not {type(answer).__name__}")
        entries = getattr(answer, self.field)
        return answer.model_copy(update={self.field: [e for e in entries if principal.allows(self.scope_of(e))]})


@dataclass(frozen=True)
class Decoded(Permission):
    """The scope is inside a binary message (a Thrift call names its namespace): the decoder checks it, with
    a token required here unless ``public``."""

    shown_as: str
    public: bool = False

    def describe(self) -> str:
        return "public" if self.public else self.shown_as


@dataclass(frozen=True, init=False)
class All(Permission):
    parts: tuple[Permission, ...]

    def __init__(self, *parts: Permission) -> None:
        object.__setattr__(self, "parts", parts)

    def describe(self) -> str:
        return "; and ".join(p.describe() for p in self.parts)

    def problems(self) -> Sequence[type[MainspringError]]:
        return [problem for p in self.parts for problem in p.problems()]

    def before_body(self, principal: Principal, values: Values) -> None:
        for part in self.parts:
            part.before_body(principal, values)

    async def after_body(self, call: Call) -> None:
        for part in self.parts:
            await part.after_body(call)

    def filter(self, principal: Principal, answer: object) -> object:
        for part in self.parts:
            answer = part.filter(principal, answer)
        return answer


__all__ = ["PUBLIC", "All", "Decoded", "Filtered", "InBody", "Owned", "Permission", "Referenced", "Scope",
           "holds_under", "unlimited"]
