"""The typed records the interactions' statements answer, and the states an item passes through."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, func, literal

from mainspring.core import leases
from mainspring.interactions.tables import interaction_queues as queues
from mainspring.interactions.tables import interaction_schedules as schedules
from mainspring.interactions.tables import interactions as items

ACTIVE = ("queued", "processing")
FINISHED = ("completed", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class InteractionRow:
    """An interaction as stored (``state`` queued | processing | completed | failed | cancelled)."""

    id: int
    queue: str
    parent_id: int | None
    name: str | None
    message_id: str | None
    channel: str | None
    user: str | None
    source: str | None
    data: Any
    result: Any
    error: str | None
    state: str
    next_processing: int | None
    attempts: int
    lease_token: str | None
    lease_expires_at: int | None
    leased_at: int | None
    worker: str | None
    wake: bool
    created_at: int
    updated_at: int
    finished_at: int | None
    error_detail: dict[str, Any] | None
    trace_parent: str | None
    priority: int
    owner: str
    """The value of the field the queue's ``owner_by`` named when the item was created ('' for none)."""

    def status(self, now: int) -> str:
        """The API's status: ``queued`` is split by ``next_processing`` into scheduled, ready and waiting."""
        if self.state != "queued":
            return self.state
        if self.next_processing is None:
            return "waiting"
        return "scheduled" if self.next_processing > now else "ready"

    def held_by(self, token: str, now: int) -> bool:
        return self.state == "processing" and leases.is_held(self.lease_token, self.lease_expires_at, token, now)


Starts = list[list[int]]
"""A rate log: the lease starts still in the window, ``[[at, n], …]`` oldest first (``n`` started at ``at``)."""


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    rate_limit_count: int | None
    rate_limit_per_ms: int | None
    concurrency: int | None
    lease_ms: int
    error_delay_ms: int
    max_attempts: int
    processing_timeout_ms: int | None
    retention_ms: int | None
    created_at: int
    updated_at: int
    paused: bool
    backoff: str
    max_delay_ms: int
    jitter: bool
    priority_aging_ms: int | None
    owner_by: str | None
    per_owner_concurrency: int | None
    per_owner_rate_count: int | None
    per_owner_rate_per_ms: int | None
    fair: bool
    weights: dict[str, int] | None
    fair_clock: int
    rate_starts: Starts | None

    @property
    def owned(self) -> bool:
        """Whether its leases go owner by owner (per-owner limits, fair shares)."""
        return self.owner_by is not None

    @property
    def limited(self) -> bool:
        """Whether a lease must hold the queue's row alone: limits to count, turns to take, or aging to rank by.

        Owned and aging queues keep the exclusive lock (issue 27 looked for a narrower one): fair turns are one
        order over all owners (the queue's ``fair_clock`` and every owner's ``turn``), so two leases side by side
        would pick the same owners and items and one would find them held (SKIP LOCKED: a short batch, not more
        throughput); a per-owner limit could be counted under the owner's row lock instead, but the clock is
        written by every fair lease, and updating the queue's row under a shared lock deadlocks two sharers."""
        return self.concurrency is not None or self.rate_limit_count is not None or self.owned or self.priority_aging_ms is not None


@dataclass(frozen=True, slots=True)
class NewInteraction:
    """What a create stores (``due_at`` None: due now; a completed one is never due)."""

    queue: str
    data: Any = None
    parent_id: int | None = None
    name: str | None = None
    message_id: str | None = None
    channel: str | None = None
    user: str | None = None
    source: str | None = None
    due_at: int | None = None
    completed: bool = False
    result: Any = None
    trace_parent: str | None = None
    """The W3C traceparent of the request that created it (tracing on)."""
    priority: int = 0


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    name: str
    cron: str
    timezone: str
    queue: str
    data: Any
    catch_up_ms: int
    next_tick: int
    source: str
    created_at: int
    updated_at: int


assert [f.name for f in dataclasses.fields(ScheduleRow)] == [c.name for c in schedules.c], "ScheduleRow drifted from the table"
assert [f.name for f in dataclasses.fields(InteractionRow)] == [c.name for c in items.c], "InteractionRow drifted from the table"
assert [f.name for f in dataclasses.fields(QueueRow)] == [c.name for c in queues.c], "QueueRow drifted from the table"


def item_row(row: Any) -> InteractionRow:
    return InteractionRow(*row)


def queue_row(row: Any) -> QueueRow:
    return QueueRow(*row)
OWNER_FIELDS = ("user", "source", "channel")


def owner_expression(owner_by: str | None) -> ColumnElement[Any]:
    """An item's owner under ``owner_by`` ('' for a null field, and for every item without ``owner_by``)."""
    if owner_by is None:
        return literal("")
    return func.coalesce(items.c[owner_by], "")


def owner_of(owner_by: str | None, values: dict[str, Any]) -> str:
    return "" if owner_by is None else values.get(owner_by) or ""
