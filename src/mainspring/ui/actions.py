"""The dashboard's actions (POST forms) and its login. Each action calls the same face service function
as the API route does, so the checks, state changes and events are the API's own."""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from mainspring.core import alerts
from mainspring.core.auth import Principal
from mainspring.core.errors import InvalidRequest, MainspringError, Unauthenticated
from mainspring.core.types import NAME_PATTERN
from mainspring.exchange import service as exchange
from mainspring.interactions import service as interactions
from mainspring.machines import service as machines
from mainspring.store import parse_time
from mainspring.ui.web import COOKIE, UIRoute, back, form_of, render, request_context, require_actor, viewer

router = APIRouter(prefix="/ui", route_class=UIRoute, include_in_schema=False)
Viewer = Annotated[Principal, Depends(viewer)]
COOKIE_MAX_AGE_S = 12 * 3600


def _local(target: str | None, default: str = "/ui/") -> str:
    """Only paths of this dashboard are followed after login (no open redirect)."""
    if not target:
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/ui") or "\\" in target:
        return default
    return target


# --- login -----------------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request) -> Response:
    is_open = await request.app.state.authenticator.is_open()
    return render(request, "login.html", page="login", next=_local(request.query_params.get("next")), is_open=is_open)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """Check the token as the API would, then keep it in an HttpOnly, SameSite=Strict cookie."""
    form = await form_of(request)
    token = form.get("token", "").strip()
    target = _local(form.get("next"))
    try:
        principal = await request.app.state.authenticator.authenticate(f"Bearer {token}" if token else None)
        principal.require_any(["admin", "ui"])
    except (Unauthenticated, MainspringError) as exc:
        return render(request, "login.html", status_code=exc.status if isinstance(exc, MainspringError) else 401,
                      page="login", next=target, is_open=False, error=exc.problem()["detail"])
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE, token, max_age=COOKIE_MAX_AGE_S, httponly=True, samesite="strict", path="/ui",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout() -> Response:
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/ui")
    return response


# --- actions ---------------------------------------------------------------------------------------


def _json_field(form: dict[str, str], name: str) -> Any:
    raw = form.get(name, "").strip()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise InvalidRequest(f"{name} is not JSON", errors=[{"loc": ["form", name], "msg": str(exc)}]) from exc


def _refusal(exc: MainspringError) -> str:
    """What the service refused, as the API would say it: the stable code, then the detail."""
    problem = exc.problem()
    return f"{problem['code']}: {problem['detail']}"


def _name(value: str) -> str:
    import re

    if not re.fullmatch(NAME_PATTERN, value):
        raise InvalidRequest("not a valid name", errors=[{"loc": ["path"], "msg": "invalid name"}])
    return value


@router.post("/alerts/{alert_id}/ack")
async def ack_alert(request: Request, principal: Viewer, alert_id: str) -> Response:
    require_actor(request, principal)
    form = await form_of(request)
    acked = await alerts.ack_alert(request_context(request).store, _name(alert_id))
    return back(_local(form.get("back")), f"alert {acked['code']} acknowledged")


@router.post("/exchange/processes/{process_id}/resolve")
async def resolve_process(request: Request, principal: Viewer, process_id: str) -> Response:
    """Resolve an IN_DOUBT process as committed (its messages go) or not committed (they come back)."""
    require_actor(request, principal)
    form = await form_of(request)
    if form.get("committed") not in ("true", "false"):
        raise InvalidRequest("committed must be true or false", errors=[{"loc": ["form", "committed"], "msg": "true or false"}])
    try:
        process = await exchange.resolve(request_context(request), _name(process_id), form["committed"] == "true")
    except MainspringError as exc:
        return back("/ui/exchange", _refusal(exc), "error")
    return back("/ui/exchange", f"process {process['id']} resolved: now {process['state']}")


@router.post("/machines/{ns}/{machine_id}/repair")
async def repair_machine(request: Request, principal: Viewer, ns: str, machine_id: str) -> Response:
    """Repair through the processor (with args), or a simple repair that only marks the machine working."""
    require_actor(request, principal)
    form = await form_of(request)
    simple = form.get("simple") == "true"
    here = f"/ui/machines/{ns}/{machine_id}"
    args = None if simple else _json_field(form, "args")
    try:
        reply = await machines.repair_machine(request_context(request), _name(ns), _name(machine_id), args, None, simple)
    except MainspringError as exc:
        return back(here, f"repair refused: {_refusal(exc)}", "error")
    if reply.status >= 400:
        return back(here, f"repair refused: {reply.body.get('code')}: {reply.body.get('detail')}", "error")
    return back(here, "simple repair: the machine is working" if simple else "repaired: the machine is working")


@router.post("/interactions/items/{interaction_id}/cancel")
async def cancel_interaction(request: Request, principal: Viewer, interaction_id: str) -> Response:
    require_actor(request, principal)
    here = f"/ui/interactions/items/{interaction_id}"
    try:
        await interactions.cancel(request_context(request).store, interaction_id)
    except MainspringError as exc:
        return back(here, _refusal(exc), "error")
    return back(here, "cancelled")


@router.post("/interactions/items/{interaction_id}/retry")
async def retry_interaction(request: Request, principal: Viewer, interaction_id: str) -> Response:
    """Try a failed or cancelled interaction again (``POST /v1/interactions/{id}/retry``), due ``in_ms`` from now."""
    require_actor(request, principal)
    form = await form_of(request)
    here = f"/ui/interactions/items/{interaction_id}"
    try:
        in_ms = int(form.get("in_ms", "0") or "0")
        if not 0 <= in_ms <= 10 * 365 * 86_400_000:
            raise ValueError("in_ms out of range")
    except ValueError as exc:
        raise InvalidRequest("give in_ms (ms from now)", errors=[{"loc": ["form"], "msg": str(exc)}]) from exc
    try:
        store = request_context(request).store
        item = await interactions.retry(store, interaction_id, store.now_ms() + in_ms if in_ms else None)
    except MainspringError as exc:
        return back(here, _refusal(exc), "error")
    return back(here, f"retried: {item['status']}, attempts {item['attempts']}")


@router.post("/interactions/items/{interaction_id}/schedule")
async def reschedule_interaction(request: Request, principal: Viewer, interaction_id: str) -> Response:
    """Postpone or advance the next processing: ``in_ms`` from now, or an RFC 3339 ``at``."""
    require_actor(request, principal)
    form = await form_of(request)
    store = request_context(request).store
    here = f"/ui/interactions/items/{interaction_id}"
    try:
        if form.get("at", "").strip():
            due_at = parse_time(form["at"].strip())
        else:
            in_ms = int(form.get("in_ms", "0") or "0")
            if not 0 <= in_ms <= 10 * 365 * 86_400_000:
                raise ValueError("in_ms out of range")
            due_at = store.now_ms() + in_ms
    except ValueError as exc:
        raise InvalidRequest("give in_ms (ms from now) or at (RFC 3339)", errors=[{"loc": ["form"], "msg": str(exc)}]) from exc
    try:
        item = await interactions.schedule(store, interaction_id, due_at)
    except MainspringError as exc:
        return back(here, _refusal(exc), "error")
    return back(here, f"rescheduled: next processing {item['next_processing']}")
