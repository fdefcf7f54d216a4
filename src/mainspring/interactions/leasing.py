"""Leases on interactions: take due items within the queue's limits, heartbeat, release with an outcome.

Limits hold across all servers because they are decided in the store: a lease locks the queue's row (so
leases of one queue are serialized, on any server), counts the queue's leased items for ``concurrency``
and keeps the current rate window (start, count) in that row for ``rate_limit``. Every write that ends
a lease is fenced by its token: a late worker gets ``409 lease_lost`` and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, select

from mainspring.core import outbox
from mainspring.core.errors import LeaseLost
from mainspring.core.leases import new_token
from mainspring.interactions import outcomes
from mainspring.interactions.service import (
    KIND,
    cancel_children,
    ensure_queue,
    event_data,
    finish,
    finished_channel,
    fmt,
    locked,
    queue_channel,
    read,
    to_api,
)
from mainspring.interactions.settings import InteractionsSettings
from mainspring.interactions.tables import interaction_queues as queues
from mainspring.interactions.tables import interactions as items
from mainspring.store import Store, Transaction

LEASE_EXPIRED = "lease expired"

# What ending or renewing a lease reads: never the payloads, which can be large.
LEASE_COLUMNS = [
    items.c[name]
    for name in ("id", "queue", "parent_id", "state", "next_processing", "attempts", "lease_token", "lease_expires_at", "leased_at", "wake")
]


@dataclass
class Leased:
    """What one lease call took, and when the caller should look again if it took less than it asked."""

    items: list[dict[str, Any]]
    next_due: int | None
    processing_timeout_ms: int | None = None
    """The queue's processing timeout as the store has it now (workers apply it at once)."""
    lease_ms: int | None = None
    """How long the leases taken run (heartbeats must come sooner)."""


async def _lock_queue(tx: Transaction, cfg: InteractionsSettings, queue: str) -> Any:
    await ensure_queue(tx, cfg, queue)
    query = select(queues).where(queues.c.name == queue)
    return (await tx.execute(tx.store.dialect.for_update(query))).one()


async def expire_leases(tx: Transaction, q: Any, now: int) -> int:
    """Expired leases of queue ``q`` (whose row ``tx`` holds) become retries, or failures once
    ``max_attempts`` is spent."""
    query = select(items).where(items.c.queue == q.name, items.c.state == "processing", items.c.lease_expires_at <= now)
    rows = (await tx.execute(tx.store.dialect.skip_locked(query))).all()
    retry = [r for r in rows if r.attempts < q.max_attempts]
    for row in rows:
        if row.attempts >= q.max_attempts:
            await finish(tx, row, "failed", now, error=LEASE_EXPIRED)
    if retry:
        due = now + q.error_delay_ms
        await tx.execute(
            items.update()
            .where(items.c.id.in_([r.id for r in retry]))
            .values(state="queued", next_processing=due, error=LEASE_EXPIRED, lease_token=None, lease_expires_at=None, updated_at=now)
        )
        await outbox.emit_many(
            tx,
            [
                outbox.Event("interaction.changed", KIND, str(r.id), {"queue": q.name, "status": "scheduled" if due > now else "ready", "next_processing": fmt(due), "error": LEASE_EXPIRED})
                for r in retry
            ],
        )
        tx.notify(queue_channel(q.name))
    return len(rows)


def _lease_end(q: Any, leased_at: int, now: int, lease_ms: int) -> int:
    end = now + lease_ms
    if q.processing_timeout_ms is not None:
        # The store enforces the processing timeout too: a lease is never extended past it.
        end = min(end, leased_at + q.processing_timeout_ms)
    return end


async def lease(store: Store, cfg: InteractionsSettings, queue: str, worker: str, max_items: int, lease_ms: int | None = None) -> Leased:
    """Lease up to ``max_items`` due interactions of ``queue``, within its concurrency and rate limits."""
    async with store.transaction() as tx:
        q = await _lock_queue(tx, cfg, queue)
        now = store.now_ms()
        await expire_leases(tx, q, now)
        room = max_items
        limited_until: int | None = None
        slots: int | None = None
        if q.concurrency is not None:
            leased_now = (
                await tx.execute(select(func.count()).select_from(items).where(items.c.queue == queue, items.c.state == "processing"))
            ).scalar_one()
            slots = q.concurrency - leased_now
            room = min(room, slots)
        window_start, window_count = q.window_start, q.window_count
        if q.rate_limit_count is not None:
            current = now - now % q.rate_limit_per_ms
            if window_start != current:
                window_start, window_count = current, 0
            left = q.rate_limit_count - window_count
            if left < room:
                limited_until = current + q.rate_limit_per_ms
            room = min(room, left)
        rows: Sequence[Any] = []
        if room > 0:
            token = new_token()
            expires = _lease_end(q, now, now, lease_ms or q.lease_ms)
            due = (
                select(items.c.id)
                .where(items.c.queue == queue, items.c.state == "queued", items.c.next_processing <= now)
                .order_by(items.c.next_processing, items.c.id)
                .limit(room)
            )
            # One statement takes the due rows (skipping rows other transactions hold) and leases them.
            taking = (
                items.update()
                .where(items.c.id.in_(store.dialect.skip_locked(due).scalar_subquery()))
                .values(
                    state="processing",
                    lease_token=token,
                    lease_expires_at=expires,
                    leased_at=now,
                    worker=worker,
                    wake=False,
                    attempts=items.c.attempts + 1,
                    updated_at=now,
                )
                .returning(*items.c)
            )
            rows = sorted((await tx.execute(taking)).all(), key=lambda r: (r.next_processing, r.id))
        taken: list[dict[str, Any]] = []
        if rows:
            if q.rate_limit_count is not None:
                window_count += len(rows)
                await tx.execute(queues.update().where(queues.c.name == queue).values(window_start=window_start, window_count=window_count))
            await outbox.emit_many(
                tx,
                [outbox.Event("interaction.changed", KIND, str(r.id), {"queue": queue, "status": "processing", "worker": worker}) for r in rows],
            )
            taken = [to_api(r, now, with_lease=True) for r in rows]
        next_due = None
        if len(rows) < max_items:
            due, expiry = await _due_and_expiry(tx, queue)
            if slots is not None and len(rows) >= slots:
                # Every slot is taken: one frees by a release (which wakes waiters) or by an expiry.
                next_due = expiry
            else:
                next_due = min((t for t in (due, expiry) if t is not None), default=None)
            if limited_until is not None and (next_due is None or next_due < limited_until):
                next_due = limited_until
    return Leased(taken, next_due, q.processing_timeout_ms, lease_ms or q.lease_ms)


async def _due_and_expiry(tx: Transaction, queue: str) -> tuple[int | None, int | None]:
    """The earliest due time of ``queue``'s waiting items and the earliest expiry of its leases."""
    due = (
        await tx.execute(select(func.min(items.c.next_processing)).where(items.c.queue == queue, items.c.state == "queued"))
    ).scalar_one()
    expiry = (
        await tx.execute(select(func.min(items.c.lease_expires_at)).where(items.c.queue == queue, items.c.state == "processing"))
    ).scalar_one()
    return due, expiry


async def lease_wait(
    store: Store, cfg: InteractionsSettings, queue: str, worker: str, max_items: int, lease_ms: int | None, wait_ms: int, poll_ms: int
) -> Leased:
    """``lease``, long-polling up to ``wait_ms`` until something is taken: woken at once by a NOTIFY or
    local signal on the queue's channel, at the earliest due time, or at the poll interval at the latest."""
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        waiter = store.notifier.waiter(queue_channel(queue))
        result = await lease(store, cfg, queue, worker, max_items, lease_ms)
        left = deadline - time.monotonic()
        if result.items or left <= 0:
            return result
        timeout = min(left, poll_ms / 1000, until_next(store, result.next_due))
        await waiter.wait(timeout)


SKIPPED_RETRY_S = 0.05


def until_next(store: Store, next_due: int | None) -> float:
    """Seconds to sleep before leasing again. Something due already (rows another transaction held)
    is looked at again after a short pause rather than in a busy loop."""
    if next_due is None:
        return float("inf")
    wait_s = (next_due - store.now_ms()) / 1000
    return wait_s if wait_s > 0 else SKIPPED_RETRY_S


def _held(row: Any, token: str, now: int) -> bool:
    return row.state == "processing" and row.lease_token == token and row.lease_expires_at is not None and row.lease_expires_at > now


async def heartbeat(store: Store, interaction_id: str, token: str, lease_ms: int | None = None) -> int:
    """Extend a held lease; answers the new expiry (epoch ms)."""
    async with store.transaction() as tx:
        row = await locked(tx, interaction_id)
        now = store.now_ms()
        if not _held(row, token, now):
            raise LeaseLost()
        q = (await tx.execute(select(queues).where(queues.c.name == row.queue))).one()
        expires = _lease_end(q, row.leased_at, now, lease_ms or q.lease_ms)
        if expires <= now:
            raise LeaseLost("the processing timeout has passed")
        await tx.execute(items.update().where(items.c.id == row.id).values(lease_expires_at=expires))
    return expires


async def heartbeat_many(store: Store, leases: Sequence[tuple[int, str]], lease_ms: int) -> set[int]:
    """Extend many leases at once (the worker runtime's heartbeat); answers the ids still held."""
    if not leases:
        return set()
    async with store.transaction() as tx:
        now = store.now_ms()
        ids = [i for i, _ in leases]
        rows = (await tx.execute(select(*LEASE_COLUMNS).where(items.c.id.in_(ids)))).all()
        tokens = dict(leases)
        held = [r for r in rows if _held(r, tokens[r.id], now)]
        names = {r.queue for r in held}
        qs = {q.name: q for q in (await tx.execute(select(queues).where(queues.c.name.in_(names)))).all()}
        kept: set[int] = set()
        params = []
        for r in held:
            expires = _lease_end(qs[r.queue], r.leased_at, now, lease_ms)
            if expires > now:
                kept.add(r.id)
                params.append({"b_id": r.id, "b_token": tokens[r.id], "b_expires": expires})
        if params:
            stmt = (
                items.update()
                .where(items.c.id == bindparam("b_id"), items.c.lease_token == bindparam("b_token"))
                .values(lease_expires_at=bindparam("b_expires"))
            )
            await tx.execute(stmt, params)
    return kept


async def release(store: Store, interaction_id: str | int, token: str, outcome: outcomes.Outcome) -> dict[str, Any]:
    """End a held lease with ``outcome``; ``409 lease_lost`` (and no change) if the lease is no longer held."""
    async with store.transaction() as tx:
        row = await locked(tx, interaction_id)
        await apply_outcome(tx, row, token, outcome)
    return await read(store, interaction_id)


async def release_many(store: Store, releases: Sequence[tuple[int, str, outcomes.Outcome]]) -> list[bool]:
    """Release many leases in one transaction (workers finishing a batch); answers, per release, whether
    the lease was still held (a lost one changes nothing)."""
    if not releases:
        return []
    async with store.transaction() as tx:
        ids = sorted({i for i, _, _ in releases})
        query = tx.store.dialect.for_update(select(*LEASE_COLUMNS).where(items.c.id.in_(ids)))
        rows = {r.id: r for r in (await tx.execute(query)).all()}
        now = store.now_ms()
        answers: list[bool] = []
        plain: list[tuple[Any, Any]] = []
        for item_id, token, outcome in releases:
            row = rows.get(item_id)
            ok = row is not None and _held(row, token, now)
            answers.append(ok)
            if not ok:
                continue
            if isinstance(outcome, outcomes.Complete) and row.parent_id is None:
                plain.append((row, outcome.result))
            else:
                await apply_outcome(tx, row, token, outcome)
        if plain:
            await _complete_plain(tx, plain, now)
    return answers


async def _complete_plain(tx: Transaction, done: list[tuple[Any, Any]], now: int) -> None:
    """Complete many parentless items in a few statements (the hot path of a busy queue)."""
    final = {"next_processing": None, "lease_token": None, "lease_expires_at": None, "finished_at": now, "updated_at": now}
    without = [r.id for r, result in done if result is None]
    with_result = [{"b_id": r.id, "b_result": result} for r, result in done if result is not None]
    if without:
        # No-result completions (the common case of a busy queue) need only one statement.
        await tx.execute(items.update().where(items.c.id.in_(without)).values(state="completed", result=None, **final))
    if with_result:
        stmt = (
            items.update()
            .where(items.c.id == bindparam("b_id"))
            .values(state="completed", result=bindparam("b_result", type_=items.c.result.type), **final)
        )
        await tx.execute(stmt, with_result)
    await outbox.emit_many(
        tx, [outbox.Event("interaction.completed", KIND, str(r.id), {"queue": r.queue, "status": "completed", "failed": False}) for r, _ in done]
    )
    await cancel_children(tx, [r.id for r, _ in done], now)
    for queue in {r.queue for r, _ in done}:
        tx.notify(finished_channel(queue))
        tx.notify(queue_channel(queue))


async def apply_outcome(tx: Transaction, row: Any, token: str, outcome: outcomes.Outcome) -> None:
    now = tx.store.now_ms()
    if not _held(row, token, now):
        raise LeaseLost()
    if isinstance(outcome, outcomes.Complete):
        await finish(tx, row, "completed", now, result=outcome.result)
        return
    if isinstance(outcome, outcomes.Fail):
        await finish(tx, row, "failed", now, error=outcome.error)
        return
    values: dict[str, Any] = {"state": "queued", "lease_token": None, "lease_expires_at": None, "wake": False, "updated_at": now}
    if isinstance(outcome, outcomes.Retry):
        q = (await tx.execute(select(queues).where(queues.c.name == row.queue))).one()
        if row.attempts >= q.max_attempts:
            await finish(tx, row, "failed", now, error=outcome.error)
            return
        values.update(next_processing=now + q.error_delay_ms, error=outcome.error)
    elif isinstance(outcome, outcomes.Repeat):
        at = outcome.at if outcome.at is not None else now + (outcome.in_ms or 0)
        values.update(next_processing=min(at, now) if row.wake else at, attempts=0)
    else:
        # A child that finished while this was being processed already asked for it to run again.
        values.update(next_processing=now if row.wake else None, attempts=0)
    await tx.execute(items.update().where(items.c.id == row.id).values(**values))
    merged = row._asdict() | values
    await outbox.emit(tx, "interaction.changed", KIND, str(row.id), event_data(_Row(merged), now))
    tx.notify(queue_channel(row.queue))


class _Row:
    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


async def expire_all(store: Store, cfg: InteractionsSettings) -> int | None:
    """Expire the leases that passed in every queue (for queues nobody leases from); answers the next
    expiry to look at again."""
    now = store.now_ms()
    async with store.read() as conn:
        names = (
            await conn.execute(select(items.c.queue).where(items.c.state == "processing", items.c.lease_expires_at <= now).distinct())
        ).scalars().all()
    for name in names:
        async with store.transaction() as tx:
            q = await _lock_queue(tx, cfg, name)
            await expire_leases(tx, q, store.now_ms())
    async with store.read() as conn:
        return (await conn.execute(select(func.min(items.c.lease_expires_at)).where(items.c.state == "processing"))).scalar_one()
