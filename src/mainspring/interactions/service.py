"""Domain functions of the interactions face: create, read, finish, retry, schedule, queue settings, retention.

Leasing, heartbeats and releases are in ``leasing``; both share the helpers here. Every change writes its
event in the same transaction and wakes the queue's waiters (NOTIFY on PostgreSQL) when ``next_processing``
is set or changed. Statements live in ``data``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from mainspring.core import finishes, outbox, tracing
from mainspring.core.paging import encode_cursor, int_cursor, int_pair_cursor
from mainspring.interactions import data, metrics
from mainspring.interactions.data import FINISHED, InteractionRow, NewInteraction, QueueRow
from mainspring.interactions.errors import (
    InteractionFinished,
    InteractionNotFinished,
    InteractionNotFound,
    ParentNotFound,
)
from mainspring.interactions.models import CreateIn
from mainspring.interactions.settings import InteractionsSettings
from mainspring.store import Store, Transaction, format_time

STATUSES = ("scheduled", "ready", "processing", "waiting", "completed", "failed", "cancelled")
KIND = "interaction"
QUEUE_KIND = "queue"

__all__ = ["FINISHED", "STATUSES"]


def queue_channel(queue: str) -> str:
    """Wakes lease waiters: something in ``queue`` became due, or a slot was freed."""
    return f"interactions:{queue}"


def finished_channel(queue: str) -> str:
    """Wakes readers waiting for an item of ``queue`` to finish."""
    return f"interactions-finished:{queue}"


def cancelled_channel(queue: str) -> str:
    """Wakes the workers of ``queue`` when an item being processed was cancelled (their handler of it stops).
    Apart from ``finished_channel``: a worker's own completions, most of a busy queue's finishes, would
    otherwise make every worker of the queue read its leases back after each of them."""
    return f"interactions-cancelled:{queue}"


def parse_id(value: str | int | None) -> int | None:
    """An interaction id from the API; ids are decimal strings, anything else names no interaction."""
    if value is None:
        return None
    digits = str(value)
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 18:
        return None
    return int(digits)


def to_api(row: InteractionRow, now: int, *, with_lease: bool = False) -> dict[str, Any]:
    lease = None
    if with_lease and row.state == "processing":
        lease = {"token": row.lease_token, "expires_at": format_time(row.lease_expires_at)}
    return {
        "id": str(row.id),
        "queue": row.queue,
        "parent_id": None if row.parent_id is None else str(row.parent_id),
        "name": row.name,
        "message_id": row.message_id,
        "channel": row.channel,
        "user": row.user,
        "source": row.source,
        "priority": row.priority,
        "data": row.data,
        "result": row.result,
        "error": row.error,
        "error_detail": row.error_detail,
        "status": row.status(now),
        "next_processing": format_time(row.next_processing),
        "attempts": row.attempts,
        "created_at": format_time(row.created_at),
        "updated_at": format_time(row.updated_at),
        "lease": lease,
        "trace_parent": row.trace_parent,
    }


def event_data(row: InteractionRow, now: int, **extra: Any) -> dict[str, Any]:
    return {"queue": row.queue, "status": row.status(now), "next_processing": format_time(row.next_processing), **extra}


# --- queues ----------------------------------------------------------------------------------------


def queue_defaults(cfg: InteractionsSettings) -> dict[str, Any]:
    return {
        "rate_limit_count": None,
        "rate_limit_per_ms": None,
        "concurrency": None,
        "lease_ms": cfg.lease_ms,
        "error_delay_ms": cfg.error_delay_ms,
        "max_attempts": cfg.max_attempts,
        "processing_timeout_ms": cfg.processing_timeout_ms,
        "retention_ms": cfg.retention_ms,
        "backoff": cfg.backoff,
        "max_delay_ms": cfg.max_delay_ms,
        "jitter": cfg.jitter,
        "priority_aging_ms": None,
        "owner_by": None,
        "per_owner_concurrency": None,
        "per_owner_rate_count": None,
        "per_owner_rate_per_ms": None,
        "fair": False,
        "weights": None,
    }


async def ensure_queue(tx: Transaction, cfg: InteractionsSettings, queue: str) -> None:
    await data.ensure_queue(tx, queue, queue_defaults(cfg))


def queue_to_api(settings: dict[str, Any], name: str) -> dict[str, Any]:
    rate = None
    if settings["rate_limit_count"] is not None:
        rate = {"count": settings["rate_limit_count"], "per_ms": settings["rate_limit_per_ms"]}
    return {
        "name": name,
        "rate_limit": rate,
        **{k: settings[k] for k in ("concurrency", "lease_ms", "error_delay_ms", "max_attempts", "processing_timeout_ms", "retention_ms")},
        **{k: settings[k] for k in data.RETRY_SETTINGS},
        **owner_settings_to_api(settings),
    }


def owner_settings_to_api(settings: dict[str, Any]) -> dict[str, Any]:
    per_owner_rate = None
    if settings.get("per_owner_rate_count") is not None:
        per_owner_rate = {"count": settings["per_owner_rate_count"], "per_ms": settings["per_owner_rate_per_ms"]}
    return {
        "priority_aging_ms": settings.get("priority_aging_ms"),
        "owner_by": settings.get("owner_by"),
        "per_owner": {"concurrency": settings.get("per_owner_concurrency"), "rate_limit": per_owner_rate},
        "fair": bool(settings.get("fair")),
        "weights": settings.get("weights") or {},
    }


def owner_settings_from_api(values: dict[str, Any]) -> dict[str, Any]:
    """The stored columns of the API's owner settings (absent ones: none)."""
    per_owner = values.get("per_owner") or {}
    rate = per_owner.get("rate_limit")
    return {
        "priority_aging_ms": values.get("priority_aging_ms"),
        "owner_by": values.get("owner_by"),
        "per_owner_concurrency": per_owner.get("concurrency"),
        "per_owner_rate_count": rate["count"] if rate else None,
        "per_owner_rate_per_ms": rate["per_ms"] if rate else None,
        "fair": bool(values.get("fair")),
        "weights": values.get("weights") or None,
    }


def _settings_of(row: QueueRow) -> dict[str, Any]:
    return {k: getattr(row, k) for k in data.QUEUE_SETTINGS}


def _stored_settings(cfg: InteractionsSettings, values: dict[str, Any]) -> dict[str, Any]:
    """The stored columns of a queue's settings as the API gives them (absent ones: the defaults)."""
    settings = queue_defaults(cfg)
    for key in ("concurrency", "lease_ms", "error_delay_ms", "max_attempts", "processing_timeout_ms", "retention_ms", *data.RETRY_SETTINGS):
        if values.get(key) is not None:
            settings[key] = values[key]
    rate = values.get("rate_limit")
    settings["rate_limit_count"] = rate["count"] if rate else None
    settings["rate_limit_per_ms"] = rate["per_ms"] if rate else None
    settings.update(owner_settings_from_api(values))
    return settings


async def put_queue(store: Store, cfg: InteractionsSettings, queue: str, values: dict[str, Any]) -> dict[str, Any]:
    """Replace a queue's settings; every server applies them at its next lease."""
    async with store.transaction() as tx:
        await data.put_queue(tx, queue, _stored_settings(cfg, values))
        # A looser limit may let waiting workers lease at once.
        tx.notify(queue_channel(queue))
    return await get_queue(store, cfg, queue)


Changes = dict[str, tuple[Any, Any]]
"""Settings a worker's ``@app.queue`` changed: name → (stored before, now)."""


def merge_queue_settings(current: dict[str, Any], given: dict[str, Any]) -> tuple[dict[str, Any], Changes]:
    """The settings ``given`` (API-shaped, as ``@app.queue`` names them) over ``current`` (as ``GET
    /v1/queues/{queue}`` answers them), and what that changes. ``per_owner`` is given whole."""
    given = dict(given)
    if "per_owner" in given:
        given["per_owner"] = {"concurrency": given["per_owner"].get("concurrency"), "rate_limit": given["per_owner"].get("rate_limit")}
    changes = {k: (current.get(k), v) for k, v in given.items() if current.get(k) != v}
    return {**current, **given}, changes


async def apply_queue_settings(store: Store, cfg: InteractionsSettings, settings: dict[str, dict[str, Any]]) -> dict[str, Changes]:
    """Store the settings a worker's ``@app.queue`` names (``settings``: per queue, API-shaped) over what each queue
    has, creating it if new: the code wins for the options it names, every other setting stays. Answers, per queue,
    what changed."""
    changed: dict[str, Changes] = {}
    async with store.transaction() as tx:
        for queue, given in settings.items():
            await ensure_queue(tx, cfg, queue)
            row = await data.lock_queue(tx, queue)
            merged, changes = merge_queue_settings(queue_to_api(_settings_of(row), queue), given)
            if changes:
                await data.put_queue(tx, queue, _stored_settings(cfg, merged))
                tx.notify(queue_channel(queue))
                changed[queue] = changes
    return changed


async def get_queue(store: Store, cfg: InteractionsSettings, queue: str) -> dict[str, Any]:
    """A queue's settings and its items counted by status (a queue never configured has the defaults)."""
    now = store.now_ms()
    async with store.read() as conn:
        row = await data.get_queue(conn, queue)
        counted = await data.count_by_status(conn, store, now, queue=queue)
    body = queue_to_api(_settings_of(row) if row is not None else queue_defaults(cfg), queue)
    body["paused"] = row is not None and row.paused
    mine = counted.by_queue.get(queue, {})
    body["counts"] = {status: mine.get(status, 0) for status in STATUSES}
    # Every count is exact (kept with the writes) but the ready/scheduled split of a queue with more than
    # data.counts.SCHEDULED_CAP of each on PostgreSQL: those two are then the planner's estimate, and named here.
    body["counts_estimated"] = counted.estimated_statuses()
    return body


async def busiest_owners(store: Store, queue: str, limit: int = 20) -> list[dict[str, Any]]:
    """The owners of ``queue`` with the most ready and processing items (who is starving whom)."""
    async with store.read() as conn:
        top = await data.owner_counts(conn, store.now_ms(), queue, limit)
    return [{"owner": owner, "ready": ready, "processing": processing} for owner, ready, processing in top]


async def pause_queue(store: Store, cfg: InteractionsSettings, queue: str, paused: bool) -> dict[str, Any]:
    """Stop (or start again) leasing from ``queue`` on every server: the state is in the queue's row, which
    each lease reads. Items leased already run on; expired leases still turn into retries."""
    async with store.transaction() as tx:
        await ensure_queue(tx, cfg, queue)
        if await data.set_paused(tx, queue, paused):
            await outbox.emit(tx, "interaction.queue.paused" if paused else "interaction.queue.resumed", QUEUE_KIND, queue, {"queue": queue})
            if not paused:
                tx.notify(queue_channel(queue))  # waiting workers lease at once
    return await get_queue(store, cfg, queue)


async def queue_names(store: Store) -> list[str]:
    async with store.read() as conn:
        return await data.queue_names(conn)


async def count_by_status(store: Store) -> data.StatusCounts:
    """Every queue's items counted by status (see ``data.StatusCounts``: which counts are estimates)."""
    async with store.read() as conn:
        return await data.count_by_status(conn, store, store.now_ms())


# --- create ----------------------------------------------------------------------------------------


def new_from(queue: str, body: CreateIn, now: int) -> NewInteraction:
    """A validated create request as ``create_rows`` takes it: ``new_interaction(queue, spec_from(body, now))``
    without dumping the model to a dict and reading it back (the direct producer's path, per item of a bulk)."""
    parent_id = None
    if body.parent_id is not None:
        parent_id = parse_id(body.parent_id)
        if parent_id is None:
            raise ParentNotFound(f"no interaction {body.parent_id}")
    return NewInteraction(
        queue=queue, data=body.data, parent_id=parent_id, name=body.name, message_id=body.message_id, channel=body.channel,
        user=body.user, source=body.source, priority=body.priority or 0, due_at=body.due_at(now), completed=body.completed,
        result=body.result, trace_parent=tracing.current_traceparent(),
    )


def spec_from(body: CreateIn, now: int) -> dict[str, Any]:
    """A validated create request (HTTP or the direct producer) as ``create`` takes it."""
    spec = body.model_dump(exclude={"process_at", "process_in_ms"})
    if body.parent_id is not None:
        parent_id = parse_id(body.parent_id)
        if parent_id is None:
            raise ParentNotFound(f"no interaction {body.parent_id}")
        spec["parent_id"] = parent_id
    spec["due_at"] = body.due_at(now)
    return spec


def new_interaction(queue: str, spec: dict[str, Any]) -> NewInteraction:
    return NewInteraction(
        queue=queue,
        data=spec.get("data"),
        parent_id=spec.get("parent_id"),
        name=spec.get("name"),
        message_id=spec.get("message_id"),
        channel=spec.get("channel"),
        user=spec.get("user"),
        source=spec.get("source"),
        priority=spec.get("priority") or 0,
        due_at=spec.get("due_at"),
        completed=bool(spec.get("completed")),
        result=spec.get("result"),
        trace_parent=tracing.current_traceparent(),
    )


async def create(store: Store, cfg: InteractionsSettings, queue: str, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create one interaction, committed together with the writes that arrive at the same moment. Answers
    (interaction, created); created is False when ``message_id`` was already used in this queue, and the
    existing one is answered."""
    row, created = await create_row(store, cfg, new_interaction(queue, spec))
    return to_api(row, store.now_ms()), created


async def create_row(store: Store, cfg: InteractionsSettings, new: NewInteraction) -> tuple[InteractionRow, bool]:
    """``create`` of a ``NewInteraction``, answering its row."""

    async def create_all(tx: Transaction, batch: list[NewInteraction]) -> list[tuple[InteractionRow, bool]]:
        return await create_in(tx, cfg, batch)

    # Creates arriving together share one INSERT (a failure among them replays each alone).
    return await store.grouped_batch(("interactions.create", id(cfg)), create_all, new)


async def create_many(
    store: Store, cfg: InteractionsSettings, queue: str, specs: Sequence[dict[str, Any]], connection: Any = None
) -> list[tuple[dict[str, Any], bool]]:
    """Create interactions in one transaction (all or none), answered in request order: a transaction of the
    store's, or the one the caller has open on ``connection`` (``Store.borrowed_transaction``; committed when
    the caller commits)."""
    answers = await create_rows(store, cfg, [new_interaction(queue, spec) for spec in specs], connection)
    now = store.now_ms()
    return [(to_api(row, now), created) for row, created in answers]


async def create_rows(
    store: Store, cfg: InteractionsSettings, batch: Sequence[NewInteraction], connection: object = None
) -> list[tuple[InteractionRow, bool]]:
    """``create_many`` of ``NewInteraction``s, answering their rows. In a transaction of the store's, a batch
    that needs no statement before its insert (its queues known, no parents to check) is that one insert
    with its events and wake-ups, committed alone: one round trip on PostgreSQL."""
    opened = store.transaction(alone=True) if connection is None else store.borrowed_transaction(connection)
    async with opened as tx:
        return await create_in(tx, cfg, batch)


async def create_in(tx: Transaction, cfg: InteractionsSettings, batch: Sequence[NewInteraction]) -> list[tuple[InteractionRow, bool]]:
    """Create ``batch`` in ``tx``, with events, parent wake-ups and queue wake-ups; per item, the row and
    whether it is new."""
    now = tx.store.now_ms()
    for queue in {new.queue for new in batch}:
        await ensure_queue(tx, cfg, queue)
    parents = {new.parent_id for new in batch if new.parent_id is not None}
    if parents:
        missing = parents - await data.existing_ids(tx, parents)
        if missing:
            raise ParentNotFound(f"no interaction {min(missing)}")
    answers: list[tuple[InteractionRow, bool] | None] = [None] * len(batch)
    queued = [i for i, new in enumerate(batch) if not new.completed]
    if len(queued) < len(batch):
        # Created-completed items are written after the insert of the others: that insert cannot be the whole
        # transaction (committed alone, nothing may follow it).
        tx.alone = False
    if queued:
        wake = sorted({queue_channel(batch[i].queue) for i in queued})
        inserted = await data.insert_queued_with_events(tx, [batch[i] for i in queued], now, wake)
        for i, row in zip(queued, inserted, strict=True):
            answers[i] = (row, True) if row is not None else (await _existing(tx, batch[i]), False)
        for queue in {batch[i].queue for i, row in zip(queued, inserted, strict=True) if row is not None}:
            tx.notify(queue_channel(queue))
    for i, new in enumerate(batch):
        if new.completed:
            answers[i] = await _create_completed(tx, new, now)
    return [answer for answer in answers if answer is not None]


async def _existing(tx: Transaction, new: NewInteraction) -> InteractionRow:
    assert new.message_id is not None
    if tx.committed_alone:
        # The insert was the whole transaction and has committed: read what it found there.
        async with tx.store.read() as conn:
            row = await data.by_message_id(conn, new.queue, new.message_id)
    else:
        row = await data.by_message_id(tx, new.queue, new.message_id)
    assert row is not None, "a message_id conflict names an existing row"
    return row


async def _create_completed(tx: Transaction, new: NewInteraction, now: int) -> tuple[InteractionRow, bool]:
    """A created-completed item: its creation and completion events, and its parent woken."""
    row = await data.insert_one(tx, new, now)
    if row is None:
        return await _existing(tx, new), False
    await outbox.emit_many(tx, [
        data.created_event(row, now),
        outbox.Event("interaction.completed", KIND, str(row.id), event_data(row, now, failed=False)),
    ])
    if row.parent_id is not None:
        await wake_parents(tx, [row.parent_id], now)
    if finishes.watched(row.message_id):
        finishes.report(tx, [finished_of(row)])
    return row, True


# --- parents and children --------------------------------------------------------------------------


async def wake_parents(tx: Transaction, parent_ids: Iterable[int], now: int) -> None:
    """A child finished: its parent is due now. A parent being processed is marked, so the outcome its
    handler returns (wait, repeat) does not lose the wake-up."""
    rows = await data.lock_active(tx, parent_ids)
    woken = [r for r in rows if r.state == "queued" and (r.next_processing is None or r.next_processing > now)]
    processing = [r.id for r in rows if r.state == "processing"]
    await data.update_many(tx, [r.id for r in woken], next_processing=now, updated_at=now)
    await data.update_many(tx, processing, wake=True, updated_at=now)
    await outbox.emit_many(tx, [
        outbox.Event("interaction.changed", KIND, str(r.id), {"queue": r.queue, "status": "ready", "next_processing": format_time(now)})
        for r in woken
    ])
    for queue in {r.queue for r in woken}:
        tx.notify(queue_channel(queue))


async def cancel_children(tx: Transaction, parent_ids: Iterable[int], now: int) -> None:
    """A finished parent cancels its unfinished children, and theirs, down the tree."""
    frontier = sorted(set(parent_ids))
    while frontier:
        rows = await data.lock_active_children(tx, frontier)
        if not rows:
            return
        ids = [r.id for r in rows]
        await data.update_many(
            tx, ids, state="cancelled", next_processing=None, lease_token=None, lease_expires_at=None, finished_at=now, updated_at=now
        )
        finishes.report(tx, [finishes.Finished(r.message_id or "", r.id, r.queue, "cancelled") for r in rows if finishes.watched(r.message_id)])
        await outbox.emit_many(tx, [
            outbox.Event("interaction.cancelled", KIND, str(r.id), {"queue": r.queue, "status": "cancelled", "by_parent": True}) for r in rows
        ])
        for queue in {r.queue for r in rows}:
            tx.notify(finished_channel(queue))
            if any(r.state == "processing" for r in rows if r.queue == queue):
                tx.notify(queue_channel(queue))
                tx.notify(cancelled_channel(queue))
        frontier = ids


async def finish(
    tx: Transaction, row: InteractionRow, state: str, now: int, *,
    result: Any = None, error: str | None = None, error_detail: dict[str, Any] | None = None,
) -> InteractionRow:
    """Move ``row`` to a final state, with its event, parent wake-up and children cancellation."""
    values: dict[str, Any] = {
        "state": state,
        "next_processing": None,
        "lease_token": None,
        "lease_expires_at": None,
        "finished_at": now,
        "updated_at": now,
    }
    if state == "completed":
        values["result"] = result
    if error is not None:
        values["error"] = error
        values["error_detail"] = error_detail
    finished = await data.update(tx, row.id, **values)
    if finishes.watched(row.message_id):
        finishes.report(tx, [finished_of(finished)])
    if state == "cancelled":
        await outbox.emit(tx, "interaction.cancelled", KIND, str(row.id), {"queue": row.queue, "status": "cancelled"})
    else:
        event: dict[str, Any] = {"queue": row.queue, "status": state, "failed": state == "failed"}
        if error is not None:
            event["error"] = error
        if error_detail is not None:
            event["error_detail"] = error_detail
        await outbox.emit(tx, "interaction.completed", KIND, str(row.id), event)
        if row.parent_id is not None:
            await wake_parents(tx, [row.parent_id], now)
    await cancel_children(tx, [row.id], now)
    tx.notify(finished_channel(row.queue))
    if row.state == "processing":
        tx.notify(queue_channel(row.queue))
        if state == "cancelled":
            tx.notify(cancelled_channel(row.queue))
    return finished


def finished_of(row: InteractionRow) -> finishes.Finished:
    """A finished item as its watcher is told (``core.finishes``)."""
    assert row.message_id is not None
    return finishes.Finished(row.message_id, row.id, row.queue, row.state, row.result, row.error)


async def locked(tx: Transaction, interaction_id: str | int) -> InteractionRow:
    key = parse_id(interaction_id)
    row = None if key is None else await data.lock(tx, key)
    if row is None:
        raise InteractionNotFound(f"no interaction {interaction_id}")
    return row


async def _locked_active(tx: Transaction, interaction_id: str) -> InteractionRow:
    row = await locked(tx, interaction_id)
    if row.state in FINISHED:
        raise InteractionFinished(f"interaction {row.id} is {row.state}", status_now=row.state)
    return row


async def complete(store: Store, interaction_id: str, result: Any) -> dict[str, Any]:
    async with store.transaction() as tx:
        row = await finish(tx, await _locked_active(tx, interaction_id), "completed", store.now_ms(), result=result)
    return to_api(row, store.now_ms())


async def fail(store: Store, interaction_id: str, error: str) -> dict[str, Any]:
    async with store.transaction() as tx:
        row = await finish(tx, await _locked_active(tx, interaction_id), "failed", store.now_ms(), error=error)
    return to_api(row, store.now_ms())


async def cancel(store: Store, interaction_id: str) -> dict[str, Any]:
    async with store.transaction() as tx:
        row = await finish(tx, await _locked_active(tx, interaction_id), "cancelled", store.now_ms())
    return to_api(row, store.now_ms())


async def schedule(store: Store, interaction_id: str, due_at: int) -> dict[str, Any]:
    """Postpone (or advance) the next processing. An item being processed keeps its lease; the outcome
    its worker releases with decides what follows."""
    async with store.transaction() as tx:
        row = await _locked_active(tx, interaction_id)
        now = store.now_ms()
        row = await data.update(tx, row.id, next_processing=due_at, updated_at=now)
        status = "processing" if row.state == "processing" else row.status(now)
        await outbox.emit(tx, "interaction.changed", KIND, str(row.id), {"queue": row.queue, "status": status, "next_processing": format_time(due_at)})
        tx.notify(queue_channel(row.queue))
    return to_api(row, now)


async def retry(store: Store, interaction_id: str, due_at: int | None = None) -> dict[str, Any]:
    """Run a failed (or cancelled) interaction again: due at ``due_at`` (now when None), its attempts back
    to 0; its last error stays on it and in its events."""
    async with store.transaction() as tx:
        row = await locked(tx, interaction_id)
        if row.state == "completed":
            raise InteractionFinished(f"interaction {row.id} is completed", status_now=row.state)
        if row.state not in ("failed", "cancelled"):
            raise InteractionNotFinished(f"interaction {row.id} is not finished", status_now=row.status(store.now_ms()))
        now = store.now_ms()
        row = await data.update(
            tx, row.id, state="queued", next_processing=now if due_at is None else due_at, attempts=0,
            finished_at=None, lease_token=None, lease_expires_at=None, wake=False, updated_at=now,
        )
        await outbox.emit(tx, "interaction.retried", KIND, str(row.id), event_data(row, now, error=row.error))
        queue = row.queue
        tx.after_commit(lambda: metrics.RETRIED.labels(queue).inc())
        tx.notify(queue_channel(row.queue))
    return to_api(row, now)


async def change_data(store: Store, interaction_id: str, new_data: Any) -> dict[str, Any]:
    """Replace an unfinished interaction's ``data`` (an item being processed keeps its lease)."""
    async with store.transaction() as tx:
        row = await _locked_active(tx, interaction_id)
        now = store.now_ms()
        row = await data.update(tx, row.id, data=new_data, updated_at=now)
        await outbox.emit(tx, "interaction.changed", KIND, str(row.id), event_data(row, now, data=new_data))
    return to_api(row, now)


# --- reads -----------------------------------------------------------------------------------------


async def get(store: Store, interaction_id: str | int) -> InteractionRow:
    key = parse_id(interaction_id)
    row = None
    if key is not None:
        async with store.read() as conn:
            row = await data.get(conn, key)
    if row is None:
        raise InteractionNotFound(f"no interaction {interaction_id}")
    return row


async def read(store: Store, interaction_id: str | int) -> dict[str, Any]:
    return to_api(await get(store, interaction_id), store.now_ms())


async def wait_finished(store: Store, interaction_id: str, wait_ms: int) -> dict[str, Any]:
    """The interaction once it is finished, or as it is after ``wait_ms``."""
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        item = await read(store, interaction_id)
        left = deadline - time.monotonic()
        if item["status"] in FINISHED or left <= 0:
            return item
        waiter = store.notifier.waiter(finished_channel(item["queue"]))
        item = await read(store, interaction_id)
        if item["status"] in FINISHED:
            return item
        # Wake-ups are hints: look again at least every second.
        await waiter.wait(min(left, 1.0))


async def list_items(store: Store, queue: str, filters: dict[str, Any], limit: int, cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """A queue's interactions, oldest first, filtered; keyset-paged by id."""
    now = store.now_ms()
    exact = {key: filters.get(key) for key in ("message_id", "channel", "user", "source")}
    after = int_cursor(cursor) if cursor else None
    async with store.read() as conn:
        rows = await data.list_items(
            conn, now, queue=queue, filters=exact, statuses=filters.get("status") or (), limit=limit + 1, after_id=after
        )
    more = len(rows) > limit
    rows = rows[:limit]
    return [to_api(r, now) for r in rows], (encode_cursor(rows[-1].id) if more else None)


async def children(store: Store, interaction_id: str, name: str | None, limit: int, cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """Children of an interaction (with ``name``), oldest first."""
    parent = await get(store, interaction_id)
    after = int_pair_cursor(cursor) if cursor else None
    async with store.read() as conn:
        rows = await data.children(conn, parent.id, name, limit + 1, after)  # type: ignore[arg-type]
    more = len(rows) > limit
    rows = rows[:limit]
    now = store.now_ms()
    return [to_api(r, now) for r in rows], (encode_cursor(rows[-1].created_at, rows[-1].id) if more else None)


async def latest_child(store: Store, interaction_id: str, name: str | None) -> dict[str, Any]:
    """The most recently created child (with ``name``)."""
    parent = await get(store, interaction_id)
    async with store.read() as conn:
        row = await data.latest_child(conn, parent.id, name)
    if row is None:
        raise InteractionNotFound(f"interaction {interaction_id} has no child named {name!r}")
    return to_api(row, store.now_ms())


async def ancestors(store: Store, parent_id: str | None, depth: int = 20) -> list[dict[str, Any]]:
    """The chain of parents from ``parent_id`` up, nearest first."""
    key = parse_id(parent_id)
    async with store.read() as conn:
        rows = await data.ancestors(conn, key, depth)
    now = store.now_ms()
    return [to_api(r, now) for r in rows]


async def mean_latency_by_bucket(store: Store, since: int, until: int, bucket_ms: int) -> dict[int, float]:
    """Mean created → finished time (ms) of what finished in each ``bucket_ms`` after ``since`` (the dashboard)."""
    async with store.read() as conn:
        return await data.mean_latency_by_bucket(conn, store, since, until, bucket_ms)


# --- retention -------------------------------------------------------------------------------------


async def prune_finished(store: Store, batch: int) -> int:
    """Delete finished items older than their queue's ``retention_ms``, at most ``batch`` per queue."""
    now = store.now_ms()
    async with store.read() as conn:
        kept = await data.queues_with_retention(conn)
    deleted = 0
    for queue, retention_ms in kept:
        async with store.transaction() as tx:
            deleted += await data.delete_finished_before(tx, queue, now - retention_ms, batch)
    # Each PostgreSQL backend counts in rows of its own: those of backends gone are folded together here.
    async with store.transaction() as tx:
        await data.fold_counts(tx)
    return deleted


async def prune_idle_owners(store: Store, batch: int) -> int:
    """Delete the owner rows that keep nothing (see ``data.prune_idle_owners``), looking at up to ``batch`` rows
    of each queue, where the last call left off; answers how many were deleted."""
    after: dict[str, str] = store.extras.setdefault("interactions:owners_pruned_after", {})
    async with store.read() as conn:
        names = await data.queues_with_owner_rows(conn)
    deleted = 0
    for queue in names:
        async with store.transaction() as tx:
            await data.lock_queue(tx, queue)
            last, n = await data.prune_idle_owners(tx, queue, store.now_ms(), after.get(queue, ""), batch)
        deleted += n
        # From the first owner again once the last was looked at.
        after[queue] = last or ""
    return deleted
