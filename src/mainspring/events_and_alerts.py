"""The core's own HTTP operations: the event log (list, long-poll, SSE) and alerts. They stand on the HTTP
toolkit like a face's ``routes.py`` (the toolkit stands on ``core``, so they cannot live inside it)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from mainspring.core import alerts, outbox
from mainspring.core.errors import AlertNotFound, InvalidRequest
from mainspring.core.paging import TimeKeyCursor
from mainspring.core.runtime import Context
from mainspring.core.types import Limit, Name, Page, Query
from mainspring.store.errors import is_unavailable
from mainspring.web.permissions import Scope
from mainspring.web.routing import Call, Routes

log = logging.getLogger("mainspring.events")
routes = Routes("/v1", tag="events and alerts")

READER = Scope("admin", "ui")


class Subject(BaseModel):
    kind: str
    id: str


class EventOut(BaseModel):
    id: str
    type: str
    at: str
    subject: Subject
    data: object


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


class EventsQuery(Query):
    after: str | None = Field(None, pattern=r"^[0-9]{0,18}$")
    """The cursor: the ``id`` of the last event read (absent or empty: from the start); any such number is a
    place in the log."""
    types: str | None = Field(None, max_length=2000)
    """Comma-separated event types; ``prefix*`` matches every type that starts with the prefix."""


class EventsPageQuery(EventsQuery):
    limit: Limit = 100
    wait_ms: int = Field(0, ge=0, le=60_000)
    """Wait up to this long for the first event when there is none yet (long poll)."""


class AlertsQuery(Page):
    cursor: TimeKeyCursor | None = None
    open: bool = False


def event_position(after: str | None) -> int:
    if after is None or after == "":
        return 0
    if not (after.isascii() and after.isdigit()) or len(after) > 18:
        raise InvalidRequest("after must be an event id", errors=[{"loc": ["query", "after"], "msg": "not an event id"}])
    return int(after)


def event_types(types: str | None) -> list[str]:
    return [t.strip() for t in (types or "").split(",") if t.strip()]


@routes.get("/events", permission=READER)
async def list_events(call: Call, query: EventsPageQuery) -> EventPage:
    """Events after the cursor, oldest first. With ``wait_ms`` it waits for the first one (long poll)."""
    ctx = call.ctx
    position = event_position(query.after)
    deadline = asyncio.get_running_loop().time() + ctx.wait_s(query.wait_ms)
    while True:
        waiter = ctx.store.notifier.waiter(outbox.EVENTS_CHANNEL)
        items, last = await outbox.read_events(ctx.store, position, query.limit, event_types(query.types))
        remaining = deadline - asyncio.get_running_loop().time()
        if items or remaining <= 0 or ctx.stopping.is_set():
            return EventPage.model_validate({"events": items, "next_cursor": str(last)})
        position = last
        await waiter.wait(min(remaining, 1.0))


@routes.get("/events/stream", permission=READER, content={"text/event-stream": {"schema": {"type": "string"}}})
async def stream_events(call: Call, query: EventsQuery) -> EventSourceResponse:
    """The event log as Server-Sent Events, live. Each SSE ``id`` is the cursor to resume from
    (the ``Last-Event-ID`` header is honoured too)."""
    return event_stream(call.ctx, event_position(call.header("last-event-id") or query.after), event_types(query.types))


def event_stream(ctx: Context, position: int, wanted: list[str]) -> EventSourceResponse:
    """The events after ``position`` (of ``wanted`` types) as a live SSE response."""

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


@routes.get("/alerts", permission=READER)
async def list_alerts(call: Call, query: AlertsQuery) -> AlertPage:
    """Alerts, newest first; ``open=true`` hides acknowledged ones."""
    items, next_cursor = await alerts.list_alerts(call.store, open_only=query.open, limit=query.limit, cursor=query.cursor)
    return AlertPage.model_validate({"alerts": items, "next_cursor": next_cursor})


@routes.post("/alerts/{alert_id}/ack", permission=Scope("admin"), problems=[AlertNotFound])
async def ack_alert(call: Call, alert_id: Name) -> AlertOut:
    """Acknowledge an alert: it is no longer open."""
    return AlertOut.model_validate(await alerts.ack_alert(call.store, alert_id))
