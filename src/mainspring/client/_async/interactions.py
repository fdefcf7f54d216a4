"""The interactions client (API.md §3): queues, items, children, leases and outcomes."""

from __future__ import annotations

import builtins
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Literal, cast
from urllib.parse import quote

from mainspring.client._async.base import AsyncBaseClient, body
from mainspring.client.errors import ResultTimeout, result_of
from mainspring.client.models import (
    Heartbeat,
    Interaction,
    InteractionPage,
    LeasesKept,
    LeasesReleased,
    Periodic,
    PerOwner,
    Queue,
    RateLimit,
)
from mainspring.types import JsonData, JsonInput

LONG_POLL_MS = 30_000
FINISHED = ("completed", "failed", "cancelled")


def _item(interaction_id: str | int) -> str:
    return f"/v1/interactions/{quote(str(interaction_id), safe='')}"


def _periodic(name: str) -> str:
    return f"/v1/periodic/{quote(name, safe='')}"


def _queue(queue: str) -> str:
    return f"/v1/queues/{quote(queue, safe='')}"


class AsyncInteractionsClient(AsyncBaseClient):
    """Every call of the interactions face. Errors raise ``mainspring.MainspringError`` subclasses
    (``NotFound``, ``Conflict``, ``LeaseLost``, ``ServiceUnavailable``…) with the problem's ``code``."""

    async def put_queue(
        self,
        queue: str,
        *,
        rate_limit: RateLimit | None = None,
        concurrency: int | None = None,
        lease_ms: int | None = None,
        error_delay_ms: int | None = None,
        max_attempts: int | None = None,
        processing_timeout_ms: int | None = None,
        retention_ms: int | None = None,
        backoff: Literal["fixed", "exponential"] | None = None,
        max_delay_ms: int | None = None,
        jitter: bool | None = None,
        priority_aging_ms: int | None = None,
        owner_by: Literal["user", "source", "channel"] | None = None,
        per_owner: PerOwner | None = None,
        fair: bool | None = None,
        weights: dict[str, int] | None = None,
    ) -> Queue:
        """Store the settings of ``queue`` (created if new); every server applies them at its next lease.
        A retry waits ``error_delay_ms`` (``backoff="fixed"``) or ``min(error_delay_ms × 2^(n−1), max_delay_ms)``
        after the n-th failed attempt (``"exponential"``); ``jitter`` draws it between 0 and that. With
        ``owner_by`` (the item field naming its owner), ``per_owner`` limits hold for each owner and ``fair``
        makes owners take turns by ``weights``; ``priority_aging_ms`` makes waiting raise an item's priority."""
        settings = {"rate_limit": rate_limit, "concurrency": concurrency, "lease_ms": lease_ms,
                    "error_delay_ms": error_delay_ms, "max_attempts": max_attempts,
                    "processing_timeout_ms": processing_timeout_ms, "retention_ms": retention_ms,
                    "backoff": backoff, "max_delay_ms": max_delay_ms, "jitter": jitter,
                    "priority_aging_ms": priority_aging_ms, "owner_by": owner_by, "per_owner": per_owner, "fair": fair,
                    "weights": weights}
        return cast(Queue, await self._json("PUT", _queue(queue), idempotent=True, json=body(**settings)))

    async def get_queue(self, queue: str) -> Queue:
        """The settings of ``queue`` and its counts by status."""
        return cast(Queue, await self._json("GET", _queue(queue), idempotent=True))

    async def pause_queue(self, queue: str) -> Queue:
        """Stop leasing from ``queue`` on every server (items leased already run on)."""
        return cast(Queue, await self._json("POST", _queue(queue) + "/pause", idempotent=True))

    async def resume_queue(self, queue: str) -> Queue:
        """Lease from a paused ``queue`` again."""
        return cast(Queue, await self._json("POST", _queue(queue) + "/resume", idempotent=True))

    async def put_periodic(self, name: str, *, cron: str, queue: str, data: JsonInput = None, timezone: str | None = None,
                           catch_up_ms: int | None = None) -> Periodic:
        """Create or replace the cron schedule ``name``: one interaction in ``queue`` per tick, once across servers."""
        sent = {"cron": cron, "queue": queue, "data": data, **body(timezone=timezone, catch_up_ms=catch_up_ms)}
        return cast(Periodic, await self._json("PUT", _periodic(name), idempotent=True, json=sent))

    async def list_periodic(self) -> builtins.list[Periodic]:
        """Every cron schedule whose queue the token may see, with its next tick."""
        return cast(dict[str, builtins.list[Periodic]], await self._json("GET", "/v1/periodic", idempotent=True))["periodic"]

    async def delete_periodic(self, name: str) -> None:
        """Stop the cron schedule ``name`` (the interactions it created stay)."""
        await self._json("DELETE", _periodic(name), idempotent=True)

    async def create(
        self,
        queue: str,
        data: JsonInput = None,
        *,
        parent_id: str | None = None,
        name: str | None = None,
        message_id: str | None = None,
        channel: str | None = None,
        user: str | None = None,
        source: str | None = None,
        priority: int | None = None,
        process_at: str | None = None,
        process_in_ms: int | None = None,
        completed: bool | None = None,
        result: JsonInput = None,
    ) -> Interaction:
        """Create an interaction in ``queue``. With ``message_id`` (unique per queue) a repeat answers the
        existing item, so the call is retried safely."""
        fields = body(data=data, parent_id=parent_id, name=name, message_id=message_id, channel=channel, user=user,
                      source=source, priority=priority, process_at=process_at, process_in_ms=process_in_ms, completed=completed,
                      result=result)
        path = f"{_queue(queue)}/interactions"
        return cast(Interaction, await self._json("POST", path, idempotent=message_id is not None, json=fields))

    async def create_many(self, queue: str, items: builtins.list[dict[str, JsonInput]]) -> builtins.list[Interaction]:
        """Create many interactions in one transaction (all or none), answered in request order. Each item
        has the fields of ``create``."""
        keyed = all(item.get("message_id") for item in items)
        page = await self._json("POST", f"{_queue(queue)}/interactions/bulk", idempotent=keyed, json={"interactions": items})
        return cast(dict[str, list[Interaction]], page)["interactions"]

    async def get(self, interaction_id: str, *, wait_ms: int | None = None) -> Interaction:
        """An interaction; with ``wait_ms``, answered as soon as it is finished (or when the wait is over)."""
        answer = await self._json("GET", _item(interaction_id), idempotent=True, params={"wait_ms": wait_ms}, wait_ms=wait_ms)
        return cast(Interaction, answer)

    async def result(self, interaction_id: str, *, timeout_s: float | None = None) -> JsonData:
        """The item's ``result`` once it is completed; ``InteractionFailed`` (with its ``error`` and
        ``error_detail``) or ``InteractionCancelled`` when it ends otherwise, ``ResultTimeout`` (a ``TimeoutError``)
        when ``timeout_s`` passes first (None: wait as long as it takes). Long-polls: no busy loop."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left_ms = LONG_POLL_MS if deadline is None else int(max(0.0, deadline - time.monotonic()) * 1000)
            item = await self.get(interaction_id, wait_ms=min(LONG_POLL_MS, left_ms) or None)
            if item["status"] in FINISHED:
                return result_of(item)
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeout(item, timeout_s or 0)

    async def list(
        self,
        queue: str,
        *,
        status: str | None = None,
        message_id: str | None = None,
        channel: str | None = None,
        user: str | None = None,
        source: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> InteractionPage:
        """One page of ``queue``'s interactions, oldest first (``status``: comma-separated statuses)."""
        params = {"status": status, "message_id": message_id, "channel": channel, "user": user, "source": source,
                  "limit": limit, "cursor": cursor}
        return cast(InteractionPage, await self._json("GET", f"{_queue(queue)}/interactions", idempotent=True, params=params))

    async def iterate(
        self,
        queue: str,
        *,
        status: str | None = None,
        message_id: str | None = None,
        channel: str | None = None,
        user: str | None = None,
        source: str | None = None,
        page_size: int = 500,
    ) -> AsyncIterator[Interaction]:
        """Every interaction of ``queue`` matching the filters, page by page."""
        cursor: str | None = None
        while True:
            page = await self.list(queue, status=status, message_id=message_id, channel=channel, user=user,
                                   source=source, limit=page_size, cursor=cursor)
            for item in page["interactions"]:
                yield item
            cursor = page.get("next_cursor")
            if not cursor:
                return

    async def children(self, interaction_id: str, name: str | None = None, *, limit: int | None = None,
                       cursor: str | None = None) -> InteractionPage:
        """The children of an interaction (with ``name``), oldest first."""
        params = {"name": name, "limit": limit, "cursor": cursor}
        return cast(InteractionPage, await self._json("GET", f"{_item(interaction_id)}/children", idempotent=True, params=params))

    async def latest_child(self, interaction_id: str, name: str | None = None) -> Interaction:
        """The newest child of an interaction (with ``name``); ``NotFound`` when it has none."""
        path = f"{_item(interaction_id)}/children/latest"
        return cast(Interaction, await self._json("GET", path, idempotent=True, params={"name": name}))

    async def complete(self, interaction_id: str, result: JsonInput = None) -> Interaction:
        """Finish an interaction as completed with ``result``; ``Conflict`` when it is already finished."""
        path = f"{_item(interaction_id)}/complete"
        return cast(Interaction, await self._json("POST", path, idempotent=False, json={"result": result}))

    async def fail(self, interaction_id: str, error: str) -> Interaction:
        """Finish an interaction as failed for good; ``Conflict`` when it is already finished."""
        path = f"{_item(interaction_id)}/fail"
        return cast(Interaction, await self._json("POST", path, idempotent=False, json={"error": error}))

    async def cancel(self, interaction_id: str) -> Interaction:
        """Cancel an interaction (and its unfinished children); a running handler is cancelled."""
        path = f"{_item(interaction_id)}/cancel"
        return cast(Interaction, await self._json("POST", path, idempotent=False))

    async def schedule(self, interaction_id: str, *, process_at: str | None = None,
                       process_in_ms: int | None = None) -> Interaction:
        """Make an unfinished interaction due at ``process_at`` (RFC 3339) or ``process_in_ms`` from now."""
        path = f"{_item(interaction_id)}/schedule"
        when = body(process_at=process_at, process_in_ms=process_in_ms)
        return cast(Interaction, await self._json("POST", path, idempotent=True, json=when))

    async def retry(self, interaction_id: str, *, process_in_ms: int | None = None) -> Interaction:
        """Try a failed (or cancelled) interaction again: attempts reset, due now (or in ``process_in_ms``).
        ``Conflict`` with ``interaction_not_finished`` for an unfinished one, ``interaction_finished`` for a
        completed one."""
        path = f"{_item(interaction_id)}/retry"
        return cast(Interaction, await self._json("POST", path, idempotent=False, json=body(process_in_ms=process_in_ms)))

    async def lease(self, queue: str, worker: str, max: int = 1, *, lease_ms: int | None = None,
                    wait_ms: int | None = None) -> InteractionPage:
        """Lease up to ``max`` due interactions of ``queue`` for ``worker``; each answered item carries its
        ``lease`` (token, expires_at). ``wait_ms`` long-polls for items that become due."""
        fields = body(worker=worker, max=max, lease_ms=lease_ms, wait_ms=wait_ms)
        answer = await self._json("POST", f"{_queue(queue)}/lease", idempotent=False, json=fields, wait_ms=wait_ms)
        return cast(InteractionPage, answer)

    async def heartbeat(self, interaction_id: str, token: str, *, lease_ms: int | None = None) -> Heartbeat:
        """Extend a lease; ``LeaseLost`` when another worker holds it now."""
        path = f"{_item(interaction_id)}/heartbeat"
        return cast(Heartbeat, await self._json("POST", path, idempotent=True, json=body(token=token, lease_ms=lease_ms)))

    async def heartbeat_many(self, queue: str, leases: Sequence[tuple[str, str]], *,
                             lease_ms: int | None = None) -> LeasesKept:
        """Extend many leases of ``queue`` in one call: ``leases`` are (id, token) pairs, at most 1,000."""
        fields = body(leases=[{"id": str(i), "token": t} for i, t in leases], lease_ms=lease_ms)
        return cast(LeasesKept, await self._json("POST", f"{_queue(queue)}/heartbeat", idempotent=True, json=fields))

    async def release_many(self, queue: str, releases: Sequence[tuple[str, str, Mapping[str, JsonInput]]]) -> LeasesReleased:
        """Store the outcomes of many leased interactions of ``queue`` in one call: ``releases`` are (id,
        token, outcome) triples, at most 1,000; a lease no longer held is answered in ``lease_lost``."""
        fields = {"releases": [{"id": str(i), "token": t, "outcome": dict(o)} for i, t, o in releases]}
        return cast(LeasesReleased, await self._json("POST", f"{_queue(queue)}/release", idempotent=False, json=fields))

    async def release(self, interaction_id: str, token: str, outcome: Mapping[str, JsonInput]) -> Interaction:
        """Store the outcome of a leased interaction: ``{"complete": {"result": …}}``, ``{"fail": {"error":
        …}}``, ``{"repeat": {"in_ms": …}}``, ``{"wait": {}}`` or ``{"retry": {"error": …}}``."""
        path = f"{_item(interaction_id)}/release"
        answer = await self._json("POST", path, idempotent=False, json={"token": token, "outcome": dict(outcome)})
        return cast(Interaction, answer)
