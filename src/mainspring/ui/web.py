"""What every dashboard page shares: the token cookie, who is looking, templates, and HTML errors."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypedDict, Unpack
from urllib.parse import parse_qs, quote, unquote, unquote_to_bytes, urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Match, Route
from starlette.templating import Jinja2Templates
from starlette.types import Scope

from mainspring.core.auth import Principal
from mainspring.core.errors import Forbidden, InvalidRequest, MainspringError, Unauthenticated
from mainspring.core.runtime import Context
from mainspring.core.types import NAME_PATTERN
from mainspring.machines.data import subject_machine
from mainspring.machines.models import check_machine_name
from mainspring.store import parse_time
from mainspring.ui.charts import bar_chart
from mainspring.web import permissions
from mainspring.web.docs_page import PAGE_HEADERS, content_security_policy
from mainspring.web.guard import check_browser_request
from mainspring.web.permissions import Permission
from mainspring.web.routing import MissingPermission

COOKIE = "mainspring_ui_token"
HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")


class LoginRequired(Exception):
    """No valid token in the cookie: the browser goes to the login page."""


def _ago(iso: str | None, now_ms: int) -> str:
    """A short human age (``3m 5s``) of an RFC 3339 time, relative to the store's clock."""
    if not iso:
        return ""
    ms = now_ms - parse_time(iso)
    sign = "in " if ms < 0 else ""
    seconds = abs(ms) // 1000
    if seconds < 60:
        text = f"{seconds}s"
    elif seconds < 3600:
        text = f"{seconds // 60}m {seconds % 60}s"
    elif seconds < 86400:
        text = f"{seconds // 3600}h {seconds % 3600 // 60}m"
    else:
        text = f"{seconds // 86400}d {seconds % 86400 // 3600}h"
    return sign + text + ("" if sign else " ago")


def _pretty(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def machine_path(namespace: str, machine_id: str) -> str:
    """A machine's two path segments (``ns/id``), each percent-encoded: a ``/`` or non-ASCII in either stays
    inside its segment (fistful's ``ff/withdrawal/session_v2`` and ``<id>/<sub-id>``), as on the JSON API."""
    return f"{quote(namespace, safe='')}/{quote(machine_id, safe='')}"


def machine_from_path(value: str) -> tuple[str, str]:
    """``(namespace, id)`` of a ``machine_path`` (how the machines page's checkboxes name each machine)."""
    namespace, _, machine_id = value.partition("/")
    return machine_name(unquote(namespace)), machine_name(unquote(machine_id))


def machine_name(value: str) -> str:
    """A namespace or machine id as the machines face takes them; a 400 page otherwise."""
    try:
        return check_machine_name(value)
    except ValueError as exc:
        raise InvalidRequest(f"not a valid namespace or machine id: {exc}", errors=[{"loc": ["path"], "msg": str(exc)}]) from exc


def subject_link(kind: str, subject_id: str) -> str | None:
    """The dashboard page of an alert's or event's subject, when it has one."""
    if kind == "machine":  # a subject names the machine unless it is hashed (an id too long for the column)
        found = subject_machine(subject_id)
        return None if found is None else f"/ui/machines/{machine_path(*found)}"
    pages = {
        "exchange.process": "/ui/exchange/processes/{}",
        "exchange.message": "/ui/exchange/messages/{}",
        "interaction": "/ui/interactions/items/{}",
        "queue": "/ui/interactions/queues/{}",
    }
    page = pages.get(kind)
    return None if page is None else page.format(quote(subject_id, safe="/"))


templates.env.filters["ago"] = _ago
templates.env.globals["subject_link"] = subject_link
templates.env.globals["machine_path"] = machine_path
templates.env.filters["segment"] = lambda value: quote(str(value), safe="")
templates.env.filters["pretty"] = _pretty
templates.env.globals["bar_chart"] = bar_chart


def page_headers() -> dict[str, str]:
    """What every dashboard answer carries: never framed, nothing sniffed, and a CSP that lets the pages run only
    the server's own scripts and the inline ``onclick`` handlers of the templates (allowed by their hashes)."""
    handlers = sorted({value for template in (HERE / "templates").glob("*.html")
                       for value in re.findall(r'\son[a-z]+="([^"]*)"', template.read_text())})
    hashes = tuple(f"'sha256-{base64.b64encode(hashlib.sha256(h.encode()).digest()).decode()}'" for h in handlers)
    return {**PAGE_HEADERS, "Content-Security-Policy": content_security_policy("", extra_script_hashes=hashes)}


def request_context(request: Request) -> Context:
    return request.app.state.context  # type: ignore[no-any-return]


async def viewer(request: Request) -> Principal:
    """Who is looking: the token in the cookie must carry ``admin`` or ``ui`` (any token when the server
    is open, like the API)."""
    token = request.cookies.get(COOKIE)
    try:
        principal: Principal = await request.app.state.authenticator.authenticate(f"Bearer {token}" if token else None)
    except Unauthenticated as exc:
        raise LoginRequired() from exc
    principal.require_any(["admin", "ui"])
    check_browser_request(request.scope, request_context(request).settings.server, open_server=principal.open)
    request.state.principal = principal
    return principal


def can_act(principal: Principal) -> bool:
    return principal.allows("admin")


VIEWER = permissions.Scope("admin", "ui")
"""Pages: a token with ``admin`` or ``ui`` (any token when the server is open, like the API)."""
ACTOR = permissions.Scope("admin")
"""Actions need ``admin`` (the ``ui`` scope only looks)."""


def same_site(request: Request) -> None:
    """Actions come from this site: the cookie is SameSite=Strict, and an Origin naming another site is
    refused as well."""
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise Forbidden("this action comes from another site")


async def form_lists(request: Request) -> dict[str, list[str]]:
    """A urlencoded form body with every value of each field (checkboxes send one per ticked box)."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return parse_qs(body, keep_blank_values=True)


async def form_of(request: Request) -> dict[str, str]:
    """A urlencoded form body as its last value per field."""
    return {k: v[-1] for k, v in (await form_lists(request)).items()}


def render(request: Request, name: str, status_code: int = 200, **values: object) -> HTMLResponse:
    principal: Principal | None = getattr(request.state, "principal", None)
    ctx = request_context(request)
    values.setdefault("flash", request.query_params.get("msg"))
    values.setdefault("flash_kind", request.query_params.get("kind", "ok"))
    return templates.TemplateResponse(
        request,
        name,
        {
            "principal": principal,
            "can_act": principal is not None and can_act(principal),
            "now_ms": ctx.store.now_ms(),
            "engine": ctx.store.dialect.name,
            **values,
        },
        status_code=status_code,
    )


def back(to: str, message: str, kind: str = "ok") -> RedirectResponse:
    """After an action, show the page again with what happened (post/redirect/get)."""
    sep = "&" if "?" in to else "?"
    return RedirectResponse(f"{to}{sep}msg={quote(message)}&kind={kind}", status_code=303)


def error_page(request: Request, error: MainspringError) -> HTMLResponse:
    return render(request, "error.html", status_code=error.status, error=error.problem())


class PageQuery(BaseModel):
    """A page's query string, validated; forms send an empty field as ``""``, which means "not given"."""

    model_config = ConfigDict(extra="ignore")

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_absent(cls, value: object) -> object:
        return None if value == "" else value


Page = Callable[..., Awaitable[Response]]


class RouteOptions(TypedDict, total=False):
    """What ``get`` and ``post`` pass on to ``_route``."""

    permission: Permission | None
    query: type[PageQuery] | None
    names: tuple[str, ...]


class SegmentRoute(Route):
    """A route matched on the path as the browser sent it, each parameter one percent-encoded segment
    decoded as UTF-8: a namespace or machine id holding ``/`` (``ff%2Fwithdrawal%2Fsession_v2``) is one
    segment, as on the JSON API (Starlette matches the decoded path, where that ``/`` splits it)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        raw = scope.get("raw_path")
        if scope["type"] != "http" or raw is None:
            return super().matches(scope)
        path = raw.split(b"?", 1)[0].decode("latin-1")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        found = self.path_regex.match(path)
        if found is None:
            return Match.NONE, {}
        try:
            params = {k: unquote_to_bytes(v).decode("utf-8") for k, v in found.groupdict().items()}
        except UnicodeDecodeError:
            return Match.NONE, {}
        child = {"endpoint": self.endpoint, "path_params": {**scope.get("path_params", {}), **params}}
        return (Match.PARTIAL if self.methods and scope["method"] not in self.methods else Match.FULL), child


class Pages:
    """The dashboard's pages and actions: each handler is called with the request, who is looking, its path
    parameters by name and, when it declares one, its validated query (``query=``). Its errors are answered
    as HTML pages (the API's are problem+json), and a missing login sends the browser to the login page."""

    def __init__(self, prefix: str = "/ui") -> None:
        self.prefix = prefix
        self.routes: list[Route] = []

    def get(self, path: str, **options: Unpack[RouteOptions]) -> Callable[[Page], Page]:
        return self._route(path, ["GET"], **options)

    def post(self, path: str, **options: Unpack[RouteOptions]) -> Callable[[Page], Page]:
        return self._route(path, ["POST"], **options)

    def _route(self, path: str, methods: list[str], *, permission: Permission | None = None,
               query: type[PageQuery] | None = None, names: tuple[str, ...] = ()) -> Callable[[Page], Page]:
        """``permission``: who may open the page or take the action (``VIEWER``, ``ACTOR``, or ``PUBLIC`` for
        the login pages), required as the API's operations' is; ``names``: path parameters that must be names
        (``NAME_PATTERN``), as the API's are."""
        if not isinstance(permission, Permission):
            raise MissingPermission(f"{methods[0]} {self.prefix + path} declares no permission")

        def register(handler: Page) -> Page:
            async def endpoint(request: Request) -> Response:
                try:
                    for name in names:
                        if not re.fullmatch(NAME_PATTERN, request.path_params[name]):
                            raise InvalidRequest(f"{name} is not a valid name", errors=[{"loc": ["path", name], "msg": "invalid name"}])
                    args: list[object] = [request]
                    if not permission.public:
                        principal = await viewer(request)
                        if not principal.open:
                            permission.before_body(principal, request.path_params)
                        if request.method == "POST":
                            same_site(request)
                        args.append(principal)
                    if query is not None:
                        args.append(query.model_validate(dict(request.query_params)))
                    return await handler(*args, **request.path_params)
                except LoginRequired:
                    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    return RedirectResponse(f"/ui/login?next={quote(target)}", status_code=303)
                except MainspringError as exc:
                    return error_page(request, exc)
                except ValidationError as exc:
                    errors = [{"loc": ["query", *e.get("loc", [])], "msg": str(e.get("msg", ""))} for e in exc.errors()]
                    return error_page(request, InvalidRequest("the request does not match what this page takes", errors=errors))

            self.routes.append(SegmentRoute(self.prefix + path, endpoint, methods=methods, name=handler.__name__))
            return handler

        return register
