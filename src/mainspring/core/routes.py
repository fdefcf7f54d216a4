"""The core's routes: the event log (list, long-poll, SSE) and alerts."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel
from sse_starlette import EventSourceResponse, ServerSentEvent

from mainspring.core import alerts, outbox
from mainspring.core.auth import Principal, authenticate
from mainspring.core.errors import InvalidRequest
from mainspring.core.http import problem_responses
from mainspring.core.runtime import Context, context_of
from mainspring.core.types import Limit, Name
from mainspring.store.errors import is_unavailable

log = logging.getLogger("mainspring.events")
router = APIRouter(prefix="/v1", tags=["events and alerts"])


class Subject(BaseModel):
    kind: str
    id: str


class EventOut(BaseModel):
    id: str
    type: str
    at: str
    subject: Subject
    data: Any


class EventPage(BaseModel):
    events: list[EventOut]
    next_cursor: str | None


class AlertOut(BaseModel):
    id: str
    at: str
    severity: str
    code: str
    subject: Subject
    detail: str
    acked_at: str | None
    resolved_at: str | None = None
    """When the server found the subject fixed and closed the alert (a closed alert is not open)."""
    resolved_by: str | None = None
    resolution: str | None = None
    """Why it was closed, e.g. ``machine repaired``."""


class AlertPage(BaseModel):
    alerts: list[AlertOut]
    next_cursor: str | None


def _position(after: str | None) -> int:
    if after is None or after == "":
        return 0
    if not after.isdigit() or len(after) > 18:
        raise InvalidRequest("after must be an event id", errors=[{"loc": ["query", "after"], "msg": "not an event id"}])
    return int(after)


def _types(types: str | None) -> list[str]:
    return [t.strip() for t in (types or "").split(",") if t.strip()]


@router.get("/events", response_model=EventPage)
async def list_events(
    ctx: Annotated[Context, Depends(context_of)],
    principal: Annotated[Principal, Depends(authenticate)],
    after: Annotated[str | None, Query(max_length=20)] = None,
    types: Annotated[str | None, Query(max_length=2000)] = None,
    limit: Limit = 100,
    wait_ms: Annotated[int, Query(ge=0, le=60_000)] = 0,
) -> dict[str, Any]:
    """Events after the cursor, oldest first. With ``wait_ms`` it waits for the first one (long poll)."""
    principal.require_any(["admin", "ui"])
    position = _position(after)
    deadline = asyncio.get_running_loop().time() + ctx.wait_s(wait_ms)
    while True:
        waiter = ctx.store.notifier.waiter(outbox.EVENTS_CHANNEL)
        items, last = await outbox.read_events(ctx.store, position, limit, _types(types))
        remaining = deadline - asyncio.get_running_loop().time()
        if items or remaining <= 0 or ctx.stopping.is_set():
            return {"events": items, "next_cursor": str(last)}
        position = last
        await waiter.wait(min(remaining, 1.0))


@router.get("/events/stream", response_class=EventSourceResponse)
async def stream_events(
    request: Request,
    ctx: Annotated[Context, Depends(context_of)],
    principal: Annotated[Principal, Depends(authenticate)],
    after: Annotated[str | None, Query(max_length=20)] = None,
    types: Annotated[str | None, Query(max_length=2000)] = None,
) -> EventSourceResponse:
    """The event log as Server-Sent Events, live. Each SSE ``id`` is the cursor to resume from
    (the ``Last-Event-ID`` header is honoured too)."""
    principal.require_any(["admin", "ui"])
    position = _position(request.headers.get("last-event-id") or after)
    wanted = _types(types)

    async def generate() -> AsyncIterator[ServerSentEvent]:
        nonlocal position
        while not ctx.stopping.is_set():
            waiter = ctx.store.notifier.waiter(outbox.EVENTS_CHANNEL)
            try:
                items, position = await outbox.read_events(ctx.store, position, 500, wanted)
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                # A failover or a restart: the stream pauses (pings go on) and carries on from its cursor.
                log.warning("event stream paused: store unavailable (%s)", exc)
                await asyncio.sleep(ctx.settings.server.poll_interval_ms / 1000)
                continue
            for item in items:
                yield ServerSentEvent(data=json.dumps(item), id=item["id"], event=item["type"])
            if not items:
                await waiter.wait(ctx.settings.server.poll_interval_ms / 1000)

    return EventSourceResponse(generate(), ping=15)


@router.get("/alerts", response_model=AlertPage)
async def list_alerts(
    ctx: Annotated[Context, Depends(context_of)],
    principal: Annotated[Principal, Depends(authenticate)],
    open: bool = False,
    limit: Limit = 100,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> dict[str, Any]:
    """Alerts, newest first; ``open=true`` hides acknowledged ones."""
    principal.require_any(["admin", "ui"])
    items, next_cursor = await alerts.list_alerts(ctx.store, open_only=open, limit=limit, cursor=cursor)
    return {"alerts": items, "next_cursor": next_cursor}


@router.post("/alerts/{alert_id}/ack", response_model=AlertOut, responses=problem_responses(404))
async def ack_alert(
    alert_id: Name,
    ctx: Annotated[Context, Depends(context_of)],
    principal: Annotated[Principal, Depends(authenticate)],
) -> dict[str, Any]:
    principal.require("admin")
    return await alerts.ack_alert(ctx.store, alert_id)
