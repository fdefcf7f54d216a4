"""The dashboard's actions (POST forms) and its login. Each action calls the same face service function
as the API route does, so the checks, state changes and events are the API's own."""

from __future__ import annotations

import json
from typing import cast
from urllib.parse import quote, urlsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from mainspring.core import alerts
from mainspring.core.auth import Principal
from mainspring.core.errors import InvalidRequest, MainspringError, Unauthenticated
from mainspring.core.types import NAME_PATTERN
from mainspring.exchange import service as exchange
from mainspring.interactions import service as interactions
from mainspring.machines import service as machines
from mainspring.store import parse_time
from mainspring.types import JsonData
from mainspring.ui.web import (
    ACTOR,
    COOKIE,
    Pages,
    back,
    form_lists,
    form_of,
    machine_from_path,
    machine_name,
    machine_path,
    render,
    request_context,
)
from mainspring.web.permissions import PUBLIC

actions = Pages("/ui")
COOKIE_MAX_AGE_S = 12 * 3600
# "All matching the filter" acts on at most this many at once; the page says when more were left.
BULK_MAX = 5000
BULK_PAGE = 500


def _local(target: str | None, default: str = "/ui/") -> str:
    """Only paths of this dashboard are followed after login (no open redirect)."""
    if not target:
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/ui") or "\\" in target:
        return default
    return target


# --- login -----------------------------------------------------------------------------------------


@actions.get("/login", permission=PUBLIC)
async def login_page(request: Request) -> Response:
    is_open = await request.app.state.authenticator.is_open()
    return render(request, "login.html", page="login", next=_local(request.query_params.get("next")), is_open=is_open)


@actions.post("/login", permission=PUBLIC)
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


@actions.post("/logout", permission=PUBLIC)
async def logout(request: Request) -> Response:
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/ui")
    return response


# --- actions ---------------------------------------------------------------------------------------


def _json_field(form: dict[str, str], name: str) -> JsonData:
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


@actions.post("/alerts/{alert_id}/ack", permission=ACTOR)
async def ack_alert(request: Request, principal: Principal, alert_id: str) -> Response:
    form = await form_of(request)
    acked = await alerts.ack_alert(request_context(request).store, _name(alert_id))
    return back(_local(form.get("back")), f"alert {acked['code']} acknowledged")


@actions.post("/exchange/processes/{process_id}/resolve", permission=ACTOR)
async def resolve_process(request: Request, principal: Principal, process_id: str) -> Response:
    """Resolve an IN_DOUBT process as committed (its messages go) or not committed (they come back)."""
    form = await form_of(request)
    if form.get("committed") not in ("true", "false"):
        raise InvalidRequest("committed must be true or false", errors=[{"loc": ["form", "committed"], "msg": "true or false"}])
    try:
        process = await exchange.resolve(request_context(request), _name(process_id), form["committed"] == "true")
    except MainspringError as exc:
        return back("/ui/exchange", _refusal(exc), "error")
    return back("/ui/exchange", f"process {process['id']} resolved: now {process['state']}")


@actions.post("/machines/{ns}/{machine_id}/repair", permission=ACTOR)
async def repair_machine(request: Request, principal: Principal, ns: str, machine_id: str) -> Response:
    """Repair through the processor (with args), or a simple repair that only marks the machine working."""
    form = await form_of(request)
    simple = form.get("simple") == "true"
    ns, machine_id = machine_name(ns), machine_name(machine_id)
    here = f"/ui/machines/{machine_path(ns, machine_id)}"
    args = None if simple else _json_field(form, "args")
    try:
        reply = await machines.repair_machine(request_context(request), ns, machine_id, args, None, simple)
    except MainspringError as exc:
        return back(here, f"repair refused: {_refusal(exc)}", "error")
    if reply.status >= 400:
        return back(here, f"repair refused: {reply.body.get('code')}: {reply.body.get('detail')}", "error")
    return back(here, "simple repair: the machine is working" if simple else "repaired: the machine is working")


@actions.post("/interactions/items/{interaction_id}/cancel", permission=ACTOR)
async def cancel_interaction(request: Request, principal: Principal, interaction_id: str) -> Response:
    here = f"/ui/interactions/items/{interaction_id}"
    try:
        await interactions.cancel(request_context(request).store, interaction_id)
    except MainspringError as exc:
        return back(here, _refusal(exc), "error")
    return back(here, "cancelled")


@actions.post("/interactions/items/{interaction_id}/retry", permission=ACTOR)
async def retry_interaction(request: Request, principal: Principal, interaction_id: str) -> Response:
    """Try a failed or cancelled interaction again (``POST /v1/interactions/{id}/retry``), due ``in_ms`` from now."""
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


@actions.post("/interactions/items/{interaction_id}/schedule", permission=ACTOR)
async def reschedule_interaction(request: Request, principal: Principal, interaction_id: str) -> Response:
    """Postpone or advance the next processing: ``in_ms`` from now, or an RFC 3339 ``at``."""
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


# --- queues: pause and resume ----------------------------------------------------------------------


@actions.post("/interactions/queues/{queue}/pause", permission=ACTOR)
async def pause_queue(request: Request, principal: Principal, queue: str) -> Response:
    """Stop leasing from the queue on every server (``POST /v1/queues/{queue}/pause``)."""
    return await _set_paused(request, principal, queue, True)


@actions.post("/interactions/queues/{queue}/resume", permission=ACTOR)
async def resume_queue(request: Request, principal: Principal, queue: str) -> Response:
    return await _set_paused(request, principal, queue, False)


async def _set_paused(request: Request, principal: Principal, queue: str, paused: bool) -> Response:
    ctx = request_context(request)
    await interactions.pause_queue(ctx.store, ctx.settings.interactions, _name(queue), paused)
    return back(f"/ui/interactions/queues/{queue}", "paused: nothing is leased until resumed" if paused else "resumed")


# --- in bulk -----------------------------------------------------------------------------------------


class Tally:
    """What a bulk action did: how many it changed, and how many each refusal code turned away."""

    def __init__(self) -> None:
        self.done = 0
        self.refused: dict[str, int] = {}

    def refuse(self, exc: MainspringError) -> None:
        code = cast(str, exc.problem()["code"])
        self.refused[code] = self.refused.get(code, 0) + 1

    def says(self, verb: str, left: bool) -> tuple[str, str]:
        text = f"{verb} {self.done}"
        if self.refused:
            text += "; refused " + ", ".join(f"{n} ({code})" for code, n in sorted(self.refused.items()))
        if left:
            text += f"; only the first {BULK_MAX} matching were taken, run it again for the rest"
        return text, "error" if self.refused and not self.done else "ok"


async def _matching_interactions(request: Request, queue: str, status: str | None) -> tuple[list[str], bool]:
    """The ids of a queue's items with ``status`` (all statuses when None), up to BULK_MAX; and whether more were left."""
    store = request_context(request).store
    ids: list[str] = []
    cursor: str | None = None
    filters = {"status": [status] if status else None}
    while len(ids) < BULK_MAX:
        page, cursor = await interactions.list_items(store, queue, filters, BULK_PAGE, cursor)
        ids.extend(str(item["id"]) for item in page)
        if cursor is None:
            return ids[:BULK_MAX], len(ids) > BULK_MAX
    return ids[:BULK_MAX], True


@actions.post("/interactions/queues/{queue}/bulk", permission=ACTOR)
async def bulk_interactions(request: Request, principal: Principal, queue: str) -> Response:
    """Retry or cancel the ticked items (``ids``), or every item matching the page's filter (``all=true``):
    each through the same service function as the single-item action, so each is checked on its own."""
    form = await form_lists(request)
    action = (form.get("action") or [""])[-1]
    status = (form.get("status") or [""])[-1] or None
    here = f"/ui/interactions/queues/{_name(queue)}" + (f"?status={status}" if status else "")
    if action not in ("retry", "cancel"):
        raise InvalidRequest("action must be retry or cancel", errors=[{"loc": ["form", "action"], "msg": "retry or cancel"}])
    if status is not None and status not in interactions.STATUSES:
        raise InvalidRequest("unknown status", errors=[{"loc": ["form", "status"], "msg": "not a status"}])
    left = False
    if (form.get("all") or [""])[-1] == "true":
        ids, left = await _matching_interactions(request, queue, status)
    else:
        ids = form.get("ids", [])[:BULK_MAX]
    if not ids:
        return back(here, "nothing selected", "error")
    store = request_context(request).store
    tally = Tally()
    for interaction_id in ids:
        try:
            if action == "retry":
                await interactions.retry(store, interaction_id)
            else:
                await interactions.cancel(store, interaction_id)
            tally.done += 1
        except MainspringError as exc:
            tally.refuse(exc)
    return back(here, *tally.says("retried" if action == "retry" else "cancelled", left))


async def _matching_failed_machines(request: Request, ns: str | None, id_part: str | None) -> tuple[list[tuple[str, str]], bool]:
    """The failed machines the machines page's filter shows, up to BULK_MAX; and whether more were left."""
    ctx = request_context(request)
    found = await machines.search_machines(ctx, "failed", id_part, BULK_MAX + 1, namespace=ns)
    return [(m["namespace"], m["id"]) for m in found[:BULK_MAX]], len(found) > BULK_MAX


@actions.post("/machines/bulk-repair", permission=ACTOR)
async def bulk_repair(request: Request, principal: Principal) -> Response:
    """Repair the ticked failed machines (``machines``: ``machine_path``), or every failed machine matching
    the filter (``all=true``): through the processor with ``args``, or simply (``simple=true``)."""
    form = await form_lists(request)
    last = {k: v[-1] for k, v in form.items()}
    simple = last.get("simple") == "true"
    args = None if simple else _json_field(last, "args")
    ns, id_part = last.get("ns") or None, last.get("id") or None
    here = "/ui/machines?status=failed" + (f"&ns={quote(machine_name(ns), safe='')}" if ns else "")
    left = False
    if last.get("all") == "true":
        keys, left = await _matching_failed_machines(request, ns, id_part)
    else:
        keys = [machine_from_path(k) for k in form.get("machines", [])[:BULK_MAX]]
    if not keys:
        return back(here, "nothing selected", "error")
    ctx = request_context(request)
    tally = Tally()
    for namespace, machine_id in keys:
        try:
            reply = await machines.repair_machine(ctx, namespace, machine_id, args, None, simple)
        except MainspringError as exc:
            tally.refuse(exc)
            continue
        tally.done += 1 if reply.status < 400 else 0
    return back(here, *tally.says("simply repaired" if simple else "repaired", left))
