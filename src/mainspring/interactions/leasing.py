"""Leases on interactions: take due items within the queue's limits, heartbeat, release with an outcome.

Limits hold across all servers because they are decided in the store: a lease locks the queue's row (so
leases of one queue are serialized, on any server), counts the queue's leased items for ``concurrency``
and keeps the current rate window (start, count) in that row for ``rate_limit``. Every write that ends
a lease is fenced by its token: a late worker gets ``409 lease_lost`` and changes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mainspring.core import outbox
from mainspring.core.errors import LeaseLost
from mainspring.core.leases import new_token
from mainspring.interactions import data, metrics, outcomes
from mainspring.interactions.data import InteractionRow, QueueRow
from mainspring.interactions.retry import retry_delay_ms
from mainspring.interactions.service import (
    KIND,
    cancel_children,
    ensure_queue,
    event_data,
    finish,
    finished_channel,
    locked,
    parse_id,
    queue_channel,
    to_api,
)
from mainspring.interactions.settings import InteractionsSettings
from mainspring.store import Store, Transaction, format_time

LEASE_EXPIRED = "lease expired"

@dataclass
class Leased:
    """What one lease call took, and when the caller should look again if it took less than it asked."""

    items: list[dict[str, Any]]
    next_due: int | None
    processing_timeout_ms: int | None = None
    """The queue's processing timeout as the store has it now (workers apply it at once)."""
    lease_ms: int | None = None
    """How long the leases taken run (heartbeats must come sooner)."""


async def _lock_queue(tx: Transaction, cfg: InteractionsSettings, queue: str) -> QueueRow:
    await ensure_queue(tx, cfg, queue)
    return await data.lock_queue(tx, queue)


async def _queue_for_lease(tx: Transaction, cfg: InteractionsSettings, queue: str, now: int) -> tuple[QueueRow, bool] | None:
    """The queue's settings, its row locked: exclusively when a concurrency or rate limit must be counted
    (leases of the queue are then serialized on every server); shared otherwise, so leases run side by side
    (SKIP LOCKED keeps them apart) but never beside an expiry sweep, which holds it exclusively. With it,
    whether any of its leases has expired at ``now``.

    Which lock to take is remembered from the queue's last lease here; None when a limit appeared under a
    shared lock (upgrading it could deadlock with another sharer): the caller begins again."""
    await ensure_queue(tx, cfg, queue)
    limited: dict[str, bool] = tx.store.extras.setdefault("interactions:limited", {})
    exclusive = limited.get(queue, True)
    q, has_expired = await data.lock_queue_for_lease(tx, queue, now, shared=not exclusive)
    limited[queue] = q.concurrency is not None or q.rate_limit_count is not None
    if limited[queue] and not exclusive:
        return None
    return q, has_expired


async def expire_leases(tx: Transaction, q: QueueRow, now: int) -> int:
    """Expired leases of queue ``q`` (whose row ``tx`` holds) become retries, or failures once
    ``max_attempts`` is spent."""
    rows = await data.expired_leases(tx, q.name, now)
    if rows:
        tx.after_commit(lambda: metrics.LEASE_EXPIRIES.labels(q.name).inc(len(rows)))
    retry = [r for r in rows if r.attempts < q.max_attempts]
    for row in rows:
        if row.attempts >= q.max_attempts:
            await finish(tx, row, "failed", now, error=LEASE_EXPIRED)
    if retry:
        # Items due at the same time are updated together: one statement with a fixed backoff, a few
        # with an exponential one (one per attempt count), one per item with jitter.
        due_of = {r.id: now + retry_delay_ms(q, r.attempts) for r in retry}
        for due in sorted(set(due_of.values())):
            await data.update_many(
                tx, [i for i, d in due_of.items() if d == due], state="queued", next_processing=due, error=LEASE_EXPIRED,
                lease_token=None, lease_expires_at=None, updated_at=now,
            )
        await outbox.emit_many(tx, [
            outbox.Event("interaction.changed", KIND, str(r.id), {"queue": q.name, "status": "scheduled" if due_of[r.id] > now else "ready",
                                                                  "next_processing": format_time(due_of[r.id]), "error": LEASE_EXPIRED})
            for r in retry
        ])
        tx.notify(queue_channel(q.name))
    return len(rows)


def _lease_end(q: QueueRow, leased_at: int, now: int, lease_ms: int) -> int:
    end = now + lease_ms
    if q.processing_timeout_ms is not None:
        # The store enforces the processing timeout too: a lease is never extended past it.
        end = min(end, leased_at + q.processing_timeout_ms)
    return end


async def lease(store: Store, cfg: InteractionsSettings, queue: str, worker: str, max_items: int, lease_ms: int | None = None) -> Leased:
    """Lease up to ``max_items`` due interactions of ``queue``, within its concurrency and rate limits."""
    while True:
        leased = await _lease_once(store, cfg, queue, worker, max_items, lease_ms)
        if leased is not None:
            return leased


async def _lease_once(store: Store, cfg: InteractionsSettings, queue: str, worker: str, max_items: int, lease_ms: int | None) -> Leased | None:
    if store.is_postgres and _known_unlimited(store, queue):
        leased = await _lease_alone(store, queue, worker, max_items, lease_ms)
        if leased is not None:
            return leased
    async with store.transaction() as tx:
        now = store.now_ms()
        locked = await _queue_for_lease(tx, cfg, queue, now)
        if locked is None:
            return None
        q, has_expired = locked
        if has_expired:
            await expire_leases(tx, q, now)
        if q.paused:
            # Nothing is due for a paused queue: resuming it wakes the waiters (NOTIFY on its channel).
            return Leased([], None, q.processing_timeout_ms, lease_ms or q.lease_ms)
        room = max_items
        limited_until: int | None = None
        slots: int | None = None
        if q.concurrency is not None:
            leased_now = await data.count_processing(tx, queue)
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
        rows: list[InteractionRow] = []
        upcoming: tuple[int | None, int | None] | None = None
        if room > 0:
            expires = _lease_end(q, now, now, lease_ms or q.lease_ms)
            took = await data.take_due_with_events(tx, queue, now, room, new_token(), expires, worker)
            rows, upcoming = took.rows, (took.next_due, took.next_expiry)
        taken: list[dict[str, Any]] = []
        if rows:
            if q.rate_limit_count is not None:
                window_count += len(rows)
                await data.set_rate_window(tx, queue, window_start, window_count)
            taken = [to_api(r, now, with_lease=True) for r in rows]
        next_due = None
        if len(rows) < max_items:
            due, expiry = upcoming if upcoming is not None else await data.next_due_and_expiry(tx, queue)
            next_due = _next_look(due, expiry, len(rows) >= slots if slots is not None else False, limited_until)
    return Leased(taken, next_due, q.processing_timeout_ms, lease_ms or q.lease_ms)


def _known_unlimited(store: Store, queue: str) -> bool:
    """The queue's row exists and had neither a concurrency nor a rate limit at its last lease here."""
    limited: dict[str, bool] = store.extras.get("interactions:limited", {})
    return limited.get(queue) is False and queue in store.extras.get("interactions:queues", ())


async def _lease_alone(store: Store, queue: str, worker: str, max_items: int, lease_ms: int | None) -> Leased | None:
    """The lease of an unlimited queue as one statement (PostgreSQL); None when the queue needs the whole
    transaction instead: expired leases to sweep first, or a limit set since its last lease."""
    async with store.transaction(alone=True) as tx:
        now = store.now_ms()
        got = await data.take_due_alone(tx, queue, now, max_items, new_token(), lease_ms, worker)
    if got is None:
        return None
    q = got.queue
    if q.paused:
        return Leased([], None, q.processing_timeout_ms, lease_ms or q.lease_ms)
    if got.taken is None:
        store.extras["interactions:limited"][queue] = q.concurrency is not None or q.rate_limit_count is not None
        return None
    rows = got.taken.rows
    next_due = _next_look(got.taken.next_due, got.taken.next_expiry, False, None) if len(rows) < max_items else None
    return Leased([to_api(r, now, with_lease=True) for r in rows], next_due, q.processing_timeout_ms, lease_ms or q.lease_ms)


def _next_look(due: int | None, expiry: int | None, every_slot_taken: bool, limited_until: int | None) -> int | None:
    """When a lease that took less than it asked should look again: at the next due item or lease expiry;
    with every slot taken, at the next expiry (a release wakes waiters sooner); never inside a spent rate
    window."""
    next_due = expiry if every_slot_taken else min((t for t in (due, expiry) if t is not None), default=None)
    if limited_until is not None and (next_due is None or next_due < limited_until):
        next_due = limited_until
    return next_due


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


async def heartbeat(store: Store, interaction_id: str, token: str, lease_ms: int | None = None) -> int:
    """Extend a held lease; answers the new expiry (epoch ms)."""
    async with store.transaction() as tx:
        row = await locked(tx, interaction_id)
        now = store.now_ms()
        if not row.held_by(token, now):
            raise LeaseLost()
        q = await data.get_queue(tx, row.queue)
        assert q is not None and row.leased_at is not None
        expires = _lease_end(q, row.leased_at, now, lease_ms or q.lease_ms)
        if expires <= now:
            raise LeaseLost("the processing timeout has passed")
        await data.update(tx, row.id, lease_expires_at=expires)
    return expires


async def heartbeat_many(store: Store, leases: Sequence[tuple[int, str]], lease_ms: int) -> set[int]:
    """Extend many leases at once (the worker runtime's heartbeat); answers the ids still held."""
    if not leases:
        return set()
    async with store.transaction() as tx:
        now = store.now_ms()
        tokens = dict(leases)
        rows = await data.lock_many(tx, tokens)
        held = [r for r in rows.values() if r.held_by(tokens[r.id], now)]
        qs = await data.queues_by_name(tx, (r.queue for r in held))
        extended = []
        for r in held:
            assert r.leased_at is not None
            expires = _lease_end(qs[r.queue], r.leased_at, now, lease_ms)
            if expires > now:
                extended.append((r.id, tokens[r.id], expires))
        await data.extend_leases(tx, extended)
    return {i for i, _, _ in extended}


async def release(store: Store, interaction_id: str | int, token: str, outcome: outcomes.Outcome) -> dict[str, Any]:
    """End a held lease with ``outcome``; ``409 lease_lost`` (and no change) if the lease is no longer held."""
    async with store.transaction() as tx:
        row = await apply_outcome(tx, await locked(tx, interaction_id), token, outcome)
    return to_api(row, store.now_ms())


async def release_many(store: Store, queue: str, releases: Sequence[tuple[int, str, outcomes.Outcome]]) -> list[bool]:
    """Release many leases of ``queue`` (workers finishing a batch); answers, per release, whether the lease
    was still held (a lost one changes nothing)."""
    if not releases:
        return []
    completed: set[int] = set()
    if store.is_postgres:
        completed = await _complete_held_alone(store, queue, releases)
    rest = [r for r in releases if r[0] not in completed]
    held = dict.fromkeys(completed, True)
    if rest:
        held.update(zip((i for i, _, _ in rest), await _release_in_transaction(store, rest), strict=True))
    return [held[i] for i, _, _ in releases]


async def release_in_queue(store: Store, queue: str, releases: Sequence[tuple[str, str, outcomes.Outcome]]) -> tuple[list[str], list[str]]:
    """``release_many`` for the API (``POST /v1/queues/{queue}/release``): answers (released ids, ids whose
    lease was not held). An id that names no item of ``queue`` is answered as not held and changes nothing."""
    mine = await _of_queue(store, queue, [raw for raw, _, _ in releases])
    chosen = [(mine[raw], token, outcome) for raw, token, outcome in releases if raw in mine]
    held = await release_many(store, queue, chosen)
    done = {item_id for (item_id, _, _), ok in zip(chosen, held, strict=True) if ok}
    return _split(releases, mine, done)


async def heartbeat_in_queue(store: Store, queue: str, leases: Sequence[tuple[str, str]], lease_ms: int | None) -> tuple[list[str], list[str]]:
    """``heartbeat_many`` for the API (``POST /v1/queues/{queue}/heartbeat``): answers (ids still held, ids
    not held). ``lease_ms`` defaults to the queue's."""
    mine = await _of_queue(store, queue, [raw for raw, _ in leases])
    if lease_ms is None:
        async with store.read() as conn:
            q = await data.get_queue(conn, queue)
        lease_ms = q.lease_ms if q is not None else 0
    kept = await heartbeat_many(store, [(mine[raw], token) for raw, token in leases if raw in mine], lease_ms) if lease_ms else set()
    return _split(leases, mine, kept)


async def _of_queue(store: Store, queue: str, raw_ids: Sequence[str]) -> dict[str, int]:
    """The given API ids that name items of ``queue`` (an item never moves between queues), by API id."""
    parsed = {raw: key for raw in raw_ids if (key := parse_id(raw)) is not None}
    async with store.read() as conn:
        queues = await data.queues_of(conn, parsed.values())
    return {raw: key for raw, key in parsed.items() if queues.get(key) == queue}


def _split(entries: Sequence[tuple[Any, ...]], mine: dict[str, int], done: set[int]) -> tuple[list[str], list[str]]:
    yes = [e[0] for e in entries if e[0] in mine and mine[e[0]] in done]
    return yes, [e[0] for e in entries if not (e[0] in mine and mine[e[0]] in done)]


async def _complete_held_alone(store: Store, queue: str, releases: Sequence[tuple[int, str, outcomes.Outcome]]) -> set[int]:
    """The hot path of a busy queue on PostgreSQL: plain completions in one statement that is its own
    transaction. What it leaves (anything else, or an item with a parent or children) is released as before."""
    plain = []
    for item_id, token, outcome in releases:
        if isinstance(outcome, outcomes.Complete):
            try:
                result = outcome.result
                # A no-op handler's None is most completions: its JSON needs no encoder.
                plain.append((item_id, token, "null" if result is None else json.dumps(result, allow_nan=False)))
            except (TypeError, ValueError):
                continue  # released the slow way, which reports what cannot be stored
    if not plain:
        return set()
    async with store.transaction(alone=True) as tx:
        done = await data.complete_held_alone(tx, plain, store.now_ms(), [finished_channel(queue), queue_channel(queue)])
    if done:
        metrics.PROCESSED.labels(queue, "completed").inc(len(done))
    return done


async def _release_in_transaction(store: Store, releases: Sequence[tuple[int, str, outcomes.Outcome]]) -> list[bool]:
    async with store.transaction() as tx:
        fences = await data.lock_fences(tx, (i for i, _, _ in releases))
        now = store.now_ms()
        answers = [i in fences and fences[i].held_by(token, now) for i, token, _ in releases]
        held = [(fences[i], token, outcome) for (i, token, outcome), ok in zip(releases, answers, strict=True) if ok]
        plain: list[tuple[data.Fence, Any]] = []
        for fence, token, outcome in held:
            if isinstance(outcome, outcomes.Complete) and fence.parent_id is None:
                plain.append((fence, outcome.result))
            else:
                # Before the plain completions: a child finishing here must not be cancelled first by its
                # parent completing in the same batch.
                await apply_outcome(tx, await locked(tx, fence.id), token, outcome)
        if plain:
            await _complete_plain(tx, plain, now)
    return answers


async def _complete_plain(tx: Transaction, done: list[tuple[data.Fence, Any]], now: int) -> None:
    """Complete many parentless items in a few statements (the hot path of a busy queue)."""
    final = {"next_processing": None, "lease_token": None, "lease_expires_at": None, "finished_at": now, "updated_at": now}
    for queue in {r.queue for r, _ in done}:
        _count(tx, queue, "completed", sum(1 for r, _ in done if r.queue == queue))
    # No-result completions (the common case of a busy queue) need only one statement.
    await data.update_many(tx, [r.id for r, result in done if result is None], state="completed", result=None, **final)
    await data.complete_with_results(tx, [(r.id, result) for r, result in done if result is not None], **final)
    await outbox.emit_many(
        tx, [outbox.Event("interaction.completed", KIND, str(r.id), {"queue": r.queue, "status": "completed", "failed": False}) for r, _ in done]
    )
    await cancel_children(tx, [r.id for r, _ in done], now)
    for queue in {r.queue for r, _ in done}:
        tx.notify(finished_channel(queue))
        tx.notify(queue_channel(queue))


async def apply_outcome(tx: Transaction, row: InteractionRow, token: str, outcome: outcomes.Outcome) -> InteractionRow:
    """End the lease ``token`` holds on ``row`` with ``outcome``; answers the item as it is now."""
    now = tx.store.now_ms()
    if not row.held_by(token, now):
        raise LeaseLost()
    if isinstance(outcome, outcomes.Complete):
        _count(tx, row.queue, "completed")
        return await finish(tx, row, "completed", now, result=outcome.result)
    if isinstance(outcome, outcomes.Fail):
        _count(tx, row.queue, "failed")
        return await finish(tx, row, "failed", now, error=outcome.error, error_detail=outcome.detail)
    values: dict[str, Any] = {"state": "queued", "lease_token": None, "lease_expires_at": None, "wake": False, "updated_at": now}
    if isinstance(outcome, outcomes.Retry):
        q = await data.get_queue(tx, row.queue)
        assert q is not None
        if row.attempts >= q.max_attempts:
            _count(tx, row.queue, "failed")
            return await finish(tx, row, "failed", now, error=outcome.error, error_detail=outcome.detail)
        values.update(next_processing=now + retry_delay_ms(q, row.attempts), error=outcome.error, error_detail=outcome.detail)
    elif isinstance(outcome, outcomes.Repeat):
        at = outcome.at if outcome.at is not None else now + (outcome.in_ms or 0)
        values.update(next_processing=min(at, now) if row.wake else at, attempts=0)
    else:
        # A child that finished while this was being processed already asked for it to run again.
        values.update(next_processing=now if row.wake else None, attempts=0)
    _count(tx, row.queue, metrics.outcome_name(outcome))
    changed = await data.update(tx, row.id, **values)
    await outbox.emit(tx, "interaction.changed", KIND, str(row.id), event_data(changed, now))
    tx.notify(queue_channel(row.queue))
    return changed


def _count(tx: Transaction, queue: str, outcome: str, n: int = 1) -> None:
    """Count a lease ended with ``outcome`` once (and only if) ``tx`` commits."""
    tx.after_commit(lambda: metrics.PROCESSED.labels(queue, outcome).inc(n))


async def expire_all(store: Store, cfg: InteractionsSettings) -> int | None:
    """Expire the leases that passed in every queue (for queues nobody leases from); answers the next
    expiry to look at again."""
    now = store.now_ms()
    async with store.read() as conn:
        names = await data.queues_with_expired_leases(conn, now)
    for name in names:
        async with store.transaction() as tx:
            q = await _lock_queue(tx, cfg, name)
            await expire_leases(tx, q, store.now_ms())
    async with store.read() as conn:
        return await data.earliest_lease_expiry(conn)
