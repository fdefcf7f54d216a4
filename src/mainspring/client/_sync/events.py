# Generated from client/_async by scripts/sync_clients.py: edit that file, not this one.
"""The event log and alerts, which every face writes to (API.md "Events" and "Alerts")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast
from urllib.parse import quote

from mainspring.client._sync.base import BaseClient
from mainspring.client.models import Alert, AlertPage, Event, EventPage


class EventsClient(BaseClient):
    """Read the event log and the alerts; acknowledge alerts."""

    def events(self, after: str | None = None, types: str | None = None, limit: int = 1000, *,
                     wait_ms: int | None = None) -> EventPage:
        """Events after the cursor ``after`` (None: from the start), oldest first; ``types`` is a
        comma-separated list (``prefix*`` allowed). ``wait_ms`` long-polls when there are none yet."""
        params = {"after": after, "types": types, "limit": limit, "wait_ms": wait_ms}
        return cast(EventPage, self._json("GET", "/v1/events", idempotent=True, params=params, wait_ms=wait_ms))

    def follow(self, after: str | None = None, types: str | None = None, *, wait_ms: int = 10_000,
                     forever: bool = True) -> Iterator[Event]:
        """Every event after ``after``; with ``forever`` it keeps long-polling for new ones."""
        cursor = after
        while True:
            page = self.events(cursor, types, wait_ms=wait_ms if forever else None)
            for event in page["events"]:
                yield event
            cursor = page.get("next_cursor") or cursor
            if not page["events"] and not forever:
                return

    def alerts(self, *, open_only: bool = True, limit: int = 100, cursor: str | None = None) -> AlertPage:
        """One page of alerts, newest first (only the unacknowledged ones with ``open_only``)."""
        params = {"open": "true" if open_only else "false", "limit": limit, "cursor": cursor}
        return cast(AlertPage, self._json("GET", "/v1/alerts", idempotent=True, params=params))

    def iterate_alerts(self, *, open_only: bool = True) -> Iterator[Alert]:
        """Every alert, page by page."""
        cursor: str | None = None
        while True:
            page = self.alerts(open_only=open_only, limit=500, cursor=cursor)
            for alert in page["alerts"]:
                yield alert
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def ack_alert(self, alert_id: str) -> Alert:
        """Acknowledge an alert (scope ``admin``)."""
        path = f"/v1/alerts/{quote(alert_id, safe='')}/ack"
        return cast(Alert, self._json("POST", path, idempotent=True))
