"""Leases on interactions: take due items within the queue's limits, heartbeat, release with an outcome.

Limits hold across all servers because they are decided in the store: a lease locks the queue's row (so
leases of one queue are serialized, on any server), counts the queue's leased items for ``concurrency``
and keeps the recent lease starts in that row for ``rate_limit`` (a sliding window: ``rate_left``). Every write
that ends a lease is fenced by its token: a late worker gets ``409 lease_lost`` and changes nothing.
"""

from __future__ import annotations

import heapq
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mainspring.core import finishes, outbox
from mainspring.core.errors import LeaseLost
from mainspring.core.leases import new_token
from mainspring.interactions import data, metrics, outcomes
from mainspring.interactions.data import InteractionRow, QueueRow, Starts
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
    limited[queue] = q.limited
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


RATE_STARTS_KEPT = 64
"""At most this many entries in a rate log: past it the oldest becomes part of the next, at the next one's time.
Its starts are then counted a little longer than they were made, never less: the limit still holds, and only a
queue whose leases start items one by one at a high rate may get a little less than its rate. (The store's
function ``mainspring_rate_started``, migration interactions_0015, keeps as many.)"""


def _rate_time(starts: Starts | None, now: int) -> int:
    """The time the log is read at: ``now``, never before its latest start (one written by a server whose clock
    runs ahead), so the times in the log only grow and every window is counted from one of them."""
    return max(now, starts[-1][0]) if starts else now


def rate_left(starts: Starts | None, now: int, per_ms: int, count: int) -> int:
    """How many more leases may start at ``now`` under a limit of ``count`` per ``per_ms``, given the log of the
    starts so far (``[[at, n], …]``, oldest first: ``n`` started at ``at``): a sliding window, so no span of
    ``per_ms`` ever holds more than ``count`` starts, wherever the wall clock's seconds begin. (A fixed window
    let ``count`` start at its end and ``count`` more at the next one's beginning; a token bucket or GCRA with a
    burst of ``count`` lets a burst and its refill into one span.)"""
    at = _rate_time(starts, now)
    return count - sum(n for t, n in starts or () if t > at - per_ms)


def rate_free_at(starts: Starts | None, now: int, per_ms: int) -> int:
    """When the oldest start counted at ``now`` leaves the window (a lease limited now may take more then)."""
    at = _rate_time(starts, now)
    return min((t for t, _ in starts or () if t > at - per_ms), default=at) + per_ms


def rate_started(starts: Starts | None, now: int, n: int, per_ms: int) -> Starts:
    """The log after ``n`` more starts at ``now``: what has left the window dropped, at most RATE_STARTS_KEPT entries."""
    at = _rate_time(starts, now)
    kept = [[t, k] for t, k in starts or () if t > at - per_ms]
    if kept and kept[-1][0] == at:
        kept[-1][1] += n
    else:
        kept.append([at, n])
    while len(kept) > RATE_STARTS_KEPT:
        oldest = kept.pop(0)
        kept[0][1] += oldest[1]
    return kept


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
    if data.leases_alone(store) and _known_unlimited(store, queue):
        leased = await _lease_alone(store, queue, worker, max_items, lease_ms)
        if leased is not None:
            return leased
    if data.leases_alone(store) and _known_fair(store, queue):
        leased = await _fair_lease_alone(store, queue, worker, max_items, lease_ms)
        if leased is not None:
            return leased
    async with store.transaction() as tx:
        return await _lease_in(tx, cfg, queue, worker, max_items, lease_ms)


async def _lease_in(tx: Transaction, cfg: InteractionsSettings, queue: str, worker: str, max_items: int, lease_ms: int | None) -> Leased | None:
    """The lease in ``tx``, its queue's row locked first (None: the queue's row was made meanwhile, lease again)."""
    store = tx.store
    now = store.now_ms()
    locked = await _queue_for_lease(tx, cfg, queue, now)
    if locked is None:
        return None
    q, has_expired = locked
    _fair_here(store)[queue] = q.owned and q.fair and q.priority_aging_ms is None
    now = max(now, store.now_ms())
    if has_expired:
        await expire_leases(tx, q, now)
    if q.paused:
        # Nothing is due for a paused queue: resuming it wakes the waiters (NOTIFY on its channel).
        return Leased([], None, q.processing_timeout_ms, lease_ms or q.lease_ms)
    room = max_items
    limited_until: int | None = None
    slots: int | None = None
    leased_now = await data.count_processing(tx, queue) if q.concurrency is not None else 0
    busy = await data.processing_by_owner(tx, queue) if q.owned and q.per_owner_concurrency is not None else {}
    # The time of the lease is read after what is processing was counted (waiting for the queue's lock, or
    # for those reads, takes a while): a release that committed before the count finished before it, and
    # the rate windows are those of that moment.
    now = max(now, store.now_ms())
    if q.concurrency is not None:
        slots = q.concurrency - leased_now
        room = min(room, slots)
    if q.rate_limit_count is not None and q.rate_limit_per_ms is not None:
        left = rate_left(q.rate_starts, now, q.rate_limit_per_ms, q.rate_limit_count)
        if left < room:
            limited_until = rate_free_at(q.rate_starts, now, q.rate_limit_per_ms)
        room = min(room, left)
    rows: list[InteractionRow] = []
    upcoming: tuple[int | None, int | None] | None = None
    if room > 0:
        expires = _lease_end(q, now, now, lease_ms or q.lease_ms)
        if q.owned or q.priority_aging_ms is not None:
            picked, exhausted, served, clock = await _pick(tx, q, now, room, busy)
            took = await data.take_ids_with_events(tx, queue, picked, now, new_token(), expires, worker, served, clock)
            if exhausted:
                # After the take: what it took is no longer queued.
                await data.settle_owner_dues(tx, queue, exhausted, now)
        else:
            took = await data.take_due_with_events(tx, queue, now, room, new_token(), expires, worker)
        rows, upcoming = took.rows, (took.next_due, took.next_expiry)
    taken: list[dict[str, Any]] = []
    if rows:
        if q.rate_limit_count is not None and q.rate_limit_per_ms is not None:
            await data.set_rate_starts(tx, queue, rate_started(q.rate_starts, now, len(rows), q.rate_limit_per_ms))
        taken = [to_api(r, now, with_lease=True) for r in rows]
    next_due = None
    if len(rows) < max_items:
        due, expiry = upcoming if upcoming is not None else await data.next_due_and_expiry(tx, queue)
        next_due = _next_look(due, expiry, len(rows) >= slots if slots is not None else False, limited_until)
    return Leased(taken, next_due, q.processing_timeout_ms, lease_ms or q.lease_ms)


TURN_STRIDE = 720_720
"""What one leased item adds to its owner's turn at weight 1 (at weight w, TURN_STRIDE // w): divisible by
every weight up to 16, so common weights share exactly."""


async def _pick(
    tx: Transaction, q: QueueRow, now: int, room: int, busy: dict[str, int]
) -> tuple[list[int], list[str], dict[str, data.OwnerState] | None, int | None]:
    """The ids a lease of ``q`` takes, at most ``room``, in order: without ``owner_by``, by effective priority;
    with it, within each owner's limits (its concurrency, its rate window), and with ``fair`` owner by owner
    in weighted turns (``busy``: each owner's items processing). With them, the owners found with nothing more
    due, whose ``next_due`` the caller settles once the items are taken; and what the take saves with the items
    (the served owners' states when they count, and the queue's new fair clock, None: unchanged). Runs under the queue's row lock, which
    every such lease takes: the counts it reads and the owner rows it writes are nobody else's until it commits."""
    if not q.owned:
        return [c.id for c in await data.ready_candidates(tx, q.name, None, now, room, aging_ms=q.priority_aging_ms)], [], None, None
    exhausted: list[str] = []
    clock: int | None = None
    if q.fair:
        taken, states, exhausted, clock = await _fair_shares(tx, q, now, room, busy)
    else:
        owners = await data.owners_with_due(tx, q.name, now)
        states = await data.owner_states(tx, q.name, owners)
        left = {o: n for o in owners if (n := _owner_room(q, now, states.setdefault(o, data.OwnerState()), room, busy.get(o, 0))) > 0}
        heads = await data.owners_heads(tx, tx.store, q.name, now, {o: (0, n) for o, n in left.items()}, q.priority_aging_ms)
        order = data.aged_order(q.priority_aging_ms) if q.priority_aging_ms is not None else (lambda c: (-c.priority, c.next_processing, c.id))
        taken = sorted((c for found in heads.values() for c in found), key=order)[:room]
    served = {c.owner: states[c.owner] for c in taken}
    if q.per_owner_rate_count is not None and q.per_owner_rate_per_ms is not None:
        for owner, n in Counter(c.owner for c in taken).items():
            served[owner].rate_starts = rate_started(served[owner].rate_starts, now, n, q.per_owner_rate_per_ms)
    return [c.id for c in taken], exhausted, served if q.per_owner_rate_count is not None or q.fair else None, clock


def _owner_room(q: QueueRow, now: int, state: data.OwnerState, room: int, processing: int) -> int:
    """How many items the owner may take now, within ``room`` and its limits."""
    if q.per_owner_concurrency is not None:
        room = min(room, q.per_owner_concurrency - processing)
    if q.per_owner_rate_count is not None and q.per_owner_rate_per_ms is not None:
        room = min(room, rate_left(state.rate_starts, now, q.per_owner_rate_per_ms, q.per_owner_rate_count))
    return room


async def _fair_shares(
    tx: Transaction, q: QueueRow, now: int, room: int, busy: dict[str, int]
) -> tuple[list[data.Candidate], dict[str, data.OwnerState], list[str], int | None]:
    """Weighted round robin (stride scheduling): the owner with the least turn takes the next item and its turn
    grows by TURN_STRIDE / its weight; an owner that had nothing due starts at the queue's clock, so it gets its
    share at once but no burst for the time it was away. Each owner's items are read in its own order, as many
    as its turns give it; one that has fewer due than that gives its turns to the others.

    Owners are read in turn order from ``interaction_owners`` (those that may have something due), a page at a
    time, only until no owner not yet read could come before those given an item: a lease reads about ``room``
    owners, however many the queue has. Answers the items, the owners' states, the owners found with nothing
    more due, and the queue's new fair clock (None: it stays), which the caller saves with the owners' states."""
    weights = q.weights or {}
    states: dict[str, data.OwnerState] = {}
    start: dict[str, int] = {}
    capacity: dict[str, int] = {}
    got: dict[str, list[data.Candidate]] = {}
    exhausted: set[str] = set()
    after: tuple[int, str] | None = None
    # Every owner not read yet starts at this turn or later (None: all were read).
    unread_from: int | None = q.fair_clock
    while True:
        share, last_turn = _stride(start, capacity, weights, room)
        if unread_from is not None and (sum(share.values()) < room or last_turn > unread_from):
            page = await data.owners_in_turn(tx, q.name, now, after, room + 1)
            for owner, state in page:
                states[owner] = state
                n = _owner_room(q, now, state, room, busy.get(owner, 0))
                if n > 0:
                    start[owner], capacity[owner], got[owner] = max(state.turn, q.fair_clock), n, []
            if len(page) <= room:
                unread_from = None
            else:
                after = (page[-1][1].turn, page[-1][0])
                unread_from = max(after[0], q.fair_clock)
            continue
        wants = {o: (len(got[o]), n - len(got[o])) for o, n in share.items() if n > len(got[o]) and o not in exhausted}
        if not wants:
            break
        heads = await data.owners_heads(tx, tx.store, q.name, now, wants, q.priority_aging_ms)
        for owner, (_, k) in wants.items():
            got[owner].extend(heads[owner])
            if len(heads[owner]) < k:
                exhausted.add(owner)
                capacity[owner] = len(got[owner])
    share, _ = _stride(start, capacity, weights, room)
    taken: list[data.Candidate] = []
    for owner, n in share.items():
        mine = got[owner][:n]
        taken.extend(mine)
        states[owner].turn = start[owner] + len(mine) * _stride_of(weights, owner)
    # The clock follows the least-served owner still waiting, so one that comes back starts beside it.
    waiting = [states[o].turn if share.get(o) else start[o] for o in capacity if o not in exhausted or len(got[o]) > share.get(o, 0)]
    if unread_from is not None:
        waiting.append(unread_from)
    clock = min(waiting) if waiting else max((states[o].turn for o in share), default=q.fair_clock)
    # The order across owners is the order of turns taken, so a worker that handles its batch in order is fair too.
    return _interleave(taken, start, weights), states, sorted(exhausted), clock if clock > q.fair_clock else None


def _stride_of(weights: dict[str, int], owner: str) -> int:
    return TURN_STRIDE // max(1, int(weights.get(owner, 1)))


def _stride(start: dict[str, int], capacity: dict[str, int], weights: dict[str, int], room: int) -> tuple[dict[str, int], int]:
    """How many items each owner gets of ``room``, taking turns from ``start``, none beyond its ``capacity``;
    and the turn at which the last one was given (-1: none)."""
    heap = [(start[o], o) for o, c in capacity.items() if c > 0]
    heapq.heapify(heap)
    share: dict[str, int] = {}
    last = -1
    while heap and room > 0:
        last, owner = heapq.heappop(heap)
        share[owner] = share.get(owner, 0) + 1
        room -= 1
        if share[owner] < capacity[owner]:
            heapq.heappush(heap, (last + _stride_of(weights, owner), owner))
    return share, last


def _interleave(taken: list[data.Candidate], start: dict[str, int], weights: dict[str, int]) -> list[data.Candidate]:
    turns: list[tuple[int, str, int, data.Candidate]] = []
    seen: dict[str, int] = {}
    for c in taken:
        n = seen[c.owner] = seen.get(c.owner, 0) + 1
        turns.append((start[c.owner] + (n - 1) * _stride_of(weights, c.owner), c.owner, n, c))
    return [t[3] for t in sorted(turns, key=lambda t: t[:3])]


def _known_unlimited(store: Store, queue: str) -> bool:
    """The queue's row exists and had neither a concurrency nor a rate limit at its last lease here."""
    limited: dict[str, bool] = store.extras.get("interactions:limited", {})
    return limited.get(queue) is False and queue in store.extras.get("interactions:queues", ())


def releases_with_lease(store: Store, queue: str) -> bool:
    """Whether ``release_and_lease`` is one round trip for ``queue`` now: one statement on PostgreSQL (an
    unlimited queue), one transaction on SQLite (whose one writer runs the two calls one after the other anyway)."""
    return not data.leases_alone(store) or _known_unlimited(store, queue)


async def release_and_lease(
    store: Store, cfg: InteractionsSettings, queue: str, worker: str, releases: Sequence[tuple[int, str, outcomes.Outcome]],
    max_items: int, lease_ms: int | None = None,
) -> tuple[list[bool], Leased]:
    """``release_many(releases)`` and then ``lease(max_items)``, as a busy worker does between two batches: on
    PostgreSQL, for an unlimited queue, the plain completions and the lease are one statement (one round trip, one
    commit), and what that statement leaves is released and leased as the two calls would; on SQLite both are one
    transaction."""
    if not data.leases_alone(store):
        async with store.transaction() as tx:
            held_in = await _release_in(tx, releases)
            leased_in = await _lease_in(tx, cfg, queue, worker, max_items, lease_ms)
        return held_in, leased_in if leased_in is not None else await lease(store, cfg, queue, worker, max_items, lease_ms)
    completed: set[int] = set()
    leased: Leased | None = None
    plain = _plain_completions(releases) if releases_with_lease(store, queue) else []
    if plain:
        async with store.transaction(alone=True) as tx:
            now = store.now_ms()
            channels = [finished_channel(queue), queue_channel(queue)]
            completed, got = await data.complete_then_take_alone(tx, plain, channels, queue, now, max_items, new_token(), lease_ms, worker)
        if completed:
            metrics.PROCESSED.labels(queue, "completed").inc(len(completed))
        leased = _leased_alone(store, queue, got, now, max_items, lease_ms)
    rest = [r for r in releases if r[0] not in completed]
    held = dict.fromkeys(completed, True)
    if rest:
        held.update(zip((i for i, _, _ in rest), await release_many(store, queue, rest), strict=True))
    if leased is None:
        leased = await lease(store, cfg, queue, worker, max_items, lease_ms)
    return [held[i] for i, _, _ in releases], leased


def _plain_completions(releases: Sequence[tuple[int, str, outcomes.Outcome]]) -> list[tuple[int, str, str]]:
    """The releases that are completions, as (id, token, result as JSON text); a result that cannot be stored is
    left for the slow way, which reports it."""
    plain = []
    for item_id, token, outcome in releases:
        if isinstance(outcome, outcomes.Complete):
            try:
                result = outcome.result
                # A no-op handler's None is most completions: its JSON needs no encoder.
                plain.append((item_id, token, "null" if result is None else json.dumps(result, allow_nan=False)))
            except (TypeError, ValueError):
                continue
    return plain


async def _lease_alone(store: Store, queue: str, worker: str, max_items: int, lease_ms: int | None) -> Leased | None:
    """The lease of an unlimited queue as one statement (PostgreSQL); None when the queue needs the whole
    transaction instead: expired leases to sweep first, or a limit set since its last lease."""
    async with store.transaction(alone=True) as tx:
        now = store.now_ms()
        got = await data.take_due_alone(tx, queue, now, max_items, new_token(), lease_ms, worker)
    return _leased_alone(store, queue, got, now, max_items, lease_ms)


def _leased_alone(store: Store, queue: str, got: data.TakenAlone | None, now: int, max_items: int, lease_ms: int | None) -> Leased | None:
    """What a one-statement lease took, as ``lease`` answers it; None when the queue needs the whole transaction."""
    if got is None:
        return None
    q = got.queue
    if q.paused and not got.has_expired:
        return Leased([], None, q.processing_timeout_ms, lease_ms or q.lease_ms)
    if got.taken is None:
        store.extras["interactions:limited"][queue] = q.limited
        return None
    rows = got.taken.rows
    next_due = _next_look(got.taken.next_due, got.taken.next_expiry, False, None) if len(rows) < max_items else None
    return Leased([to_api(r, now, with_lease=True) for r in rows], next_due, q.processing_timeout_ms, lease_ms or q.lease_ms)


def _fair_here(store: Store) -> dict[str, bool]:
    """Per queue, whether its last lease here found it fair and owned without aging (the one-call lease's case)."""
    fair: dict[str, bool] = store.extras.setdefault("interactions:fair", {})
    return fair


def _known_fair(store: Store, queue: str) -> bool:
    return _fair_here(store).get(queue, False)


async def _fair_lease_alone(store: Store, queue: str, worker: str, max_items: int, lease_ms: int | None) -> Leased | None:
    """The lease of a fair owned queue in one round trip (PostgreSQL: the function of migration interactions_0014 runs
    ``_lease_once``'s statements, ``_fair_shares`` included, in the same order and under the same locks). None when the
    queue needs the transaction instead: expired leases to sweep first, or its settings changed since its last lease."""
    async with store.transaction(alone=True) as tx:
        now = store.now_ms()
        got = await data.fair_lease_alone(tx, queue, now, max_items, new_token(), lease_ms, worker, TURN_STRIDE)
    if got.status == "other":
        _fair_here(store)[queue] = False
    if got.status == "paused":
        # The function answers a paused queue before it looks for expired leases, which a lease of a paused queue
        # still sweeps (the transaction's order): a paused queue is not a hot path, so the transaction answers it.
        return None
    if got.taken is None:
        return None
    rows = got.taken.rows
    slots = got.slots
    next_due = None
    if len(rows) < max_items:
        next_due = _next_look(got.taken.next_due, got.taken.next_expiry, len(rows) >= slots if slots is not None else False, got.limited_until)
    # The lease's time may be later than ``now`` (an item that finished later): its items show as of then.
    taken = [to_api(r, max(now, r.leased_at or now), with_lease=True) for r in rows]
    return Leased(taken, next_due, got.processing_timeout_ms, lease_ms or got.lease_ms)


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
            _remember_tokens(store, queue, result.items)
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
    if data.leases_alone(store):
        completed = await _complete_held_alone(store, queue, releases)
    rest = [r for r in releases if r[0] not in completed]
    held = dict.fromkeys(completed, True)
    if rest:
        held.update(zip((i for i, _, _ in rest), await _release_in_transaction(store, rest), strict=True))
    return [held[i] for i, _, _ in releases]


async def release_in_queue(store: Store, queue: str, releases: Sequence[tuple[str, str, outcomes.Outcome]]) -> tuple[list[str], list[str]]:
    """``release_many`` for the API (``POST /v1/queues/{queue}/release``): answers (released ids, ids whose
    lease was not held). An id that names no item of ``queue`` is answered as not held and changes nothing."""
    mine = await _of_queue(store, queue, [(raw, token) for raw, token, _ in releases])
    chosen = [(mine[raw], token, outcome) for raw, token, outcome in releases if raw in mine]
    held = await release_many(store, queue, chosen)
    done = {item_id for (item_id, _, _), ok in zip(chosen, held, strict=True) if ok}
    return _split(releases, mine, done)


async def heartbeat_in_queue(store: Store, queue: str, leases: Sequence[tuple[str, str]], lease_ms: int | None) -> tuple[list[str], list[str]]:
    """``heartbeat_many`` for the API (``POST /v1/queues/{queue}/heartbeat``): answers (ids still held, ids
    not held). ``lease_ms`` defaults to the queue's."""
    mine = await _of_queue(store, queue, leases)
    if lease_ms is None:
        async with store.read() as conn:
            q = await data.get_queue(conn, queue)
        lease_ms = q.lease_ms if q is not None else 0
    kept = await heartbeat_many(store, [(mine[raw], token) for raw, token in leases if raw in mine], lease_ms) if lease_ms else set()
    return _split(leases, mine, kept)


TOKENS_REMEMBERED = 4096
"""Lease tokens this process answered over the API, with their queue (the newest kept): ~1 per lease call."""


def _tokens_here(store: Store) -> dict[str, str]:
    """The queue of each lease token the lease route of this process answered lately, oldest first."""
    tokens: dict[str, str] = store.extras.setdefault("interactions:lease-tokens", {})
    return tokens


def _remember_tokens(store: Store, queue: str, items: Sequence[dict[str, Any]]) -> None:
    """Keep the tokens of a lease answered over the API (one per lease call), so that their releases and
    heartbeats need not read their items' queue (``_of_queue``)."""
    if not items:
        return
    tokens = _tokens_here(store)
    for token in {item["lease"]["token"] for item in items}:
        tokens[token] = queue
    while len(tokens) > TOKENS_REMEMBERED:
        del tokens[next(iter(tokens))]


async def _of_queue(store: Store, queue: str, entries: Sequence[tuple[Any, ...]]) -> dict[str, int]:
    """The API ids of ``entries`` (id, token, …) that may name items of ``queue`` (an item never moves between
    queues), by API id. An entry whose token this process handed out for a lease of ``queue`` is taken without
    reading: its write is fenced by that token, and every item holding it was leased in that lease, from
    ``queue`` (a token is made fresh for each lease call: ``new_token``); an id that is not one of those items
    fails the fence, is answered as not held and changes nothing, as an item of another queue is. Any other
    entry's item is read."""
    known = _tokens_here(store)
    parsed: dict[str, int] = {}
    unknown: dict[str, int] = {}
    for raw, token, *_ in entries:
        key = parse_id(raw)
        if key is None:
            continue
        if known.get(token) == queue:
            parsed[raw] = key
        else:
            unknown[raw] = key
    if unknown:
        async with store.read() as conn:
            queues = await data.queues_of(conn, unknown.values())
        parsed.update((raw, key) for raw, key in unknown.items() if queues.get(key) == queue)
    return parsed


def _split(entries: Sequence[tuple[Any, ...]], mine: dict[str, int], done: set[int]) -> tuple[list[str], list[str]]:
    yes = [e[0] for e in entries if e[0] in mine and mine[e[0]] in done]
    return yes, [e[0] for e in entries if not (e[0] in mine and mine[e[0]] in done)]


async def _complete_held_alone(store: Store, queue: str, releases: Sequence[tuple[int, str, outcomes.Outcome]]) -> set[int]:
    """The hot path of a busy queue on PostgreSQL: plain completions in one statement that is its own
    transaction. What it leaves (anything else, or an item with a parent or children) is released as before."""
    plain = _plain_completions(releases)
    if not plain:
        return set()
    async with store.transaction(alone=True) as tx:
        done = await data.complete_held_alone(tx, plain, store.now_ms(), [finished_channel(queue), queue_channel(queue)])
    if done:
        metrics.PROCESSED.labels(queue, "completed").inc(len(done))
    return done


async def _release_in_transaction(store: Store, releases: Sequence[tuple[int, str, outcomes.Outcome]]) -> list[bool]:
    async with store.transaction() as tx:
        return await _release_in(tx, releases)


async def _release_in(tx: Transaction, releases: Sequence[tuple[int, str, outcomes.Outcome]]) -> list[bool]:
    """Store each outcome whose lease still holds, in ``tx``; per release, whether it held."""
    store = tx.store
    fences = await data.lock_fences(tx, (i for i, _, _ in releases))
    now = store.now_ms()
    answers = [i in fences and fences[i].held_by(token, now) for i, token, _ in releases]
    held = [(fences[i], token, outcome) for (i, token, outcome), ok in zip(releases, answers, strict=True) if ok]
    plain: list[tuple[data.Fence, Any]] = []
    for fence, token, outcome in held:
        if isinstance(outcome, outcomes.Complete) and fence.parent_id is None and not finishes.watched(fence.message_id):
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
