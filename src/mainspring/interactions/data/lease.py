"""Leasing: due items taken under a token with their events, in the pick order (by priority, or aged, or by owner
for fair queues), and what is due next."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, column, func, select, text

from mainspring.core import outbox
from mainspring.core.outbox import SEQUENCER_CHANNEL
from mainspring.interactions.data.owners import (
    SAVED_OWNERS_CTES,
    SETTLE_READ,
    OwnerState,
    owner_state_params,
    save_owner_states,
)
from mainspring.interactions.data.release import (
    COMPLETE_HELD_CTES,
    DONE_WOKEN,
    complete_held_params,
    notify_completed,
)
from mainspring.interactions.data.rows import InteractionRow, QueueRow, item_row, queue_row
from mainspring.interactions.tables import interaction_queues as queues
from mainspring.interactions.tables import interactions as items
from mainspring.store import Store, Transaction
from mainspring.store.dialect import Executor, picked_once
from mainspring.store.notify import PG_CHANNEL
from mainspring.store.schema import Millis, constant


def leases_alone(store: Store) -> bool:
    """Whether this store has the lease and release statements that are whole transactions of their own
    (``take_due_alone``, ``fair_lease_alone``, ``complete_held_alone``: PostgreSQL's data-modifying CTEs and
    functions, one round trip each); SQLite's one writer has no round trips to save."""
    return store.is_postgres


async def expired_leases(tx: Transaction, queue: str, now: int) -> list[InteractionRow]:
    query = select(items).where(items.c.queue == queue, items.c.state == constant("processing"), items.c.lease_expires_at <= now)
    return [item_row(r) for r in (await tx.execute(tx.store.dialect.skip_locked(query))).all()]


async def count_processing(tx: Executor, queue: str) -> int:
    return int((await tx.execute(select(func.count()).select_from(items).where(items.c.queue == queue, items.c.state == constant("processing")))).scalar_one())


def pick_order(row: InteractionRow) -> tuple[int, int, int]:
    """The lease's order without aging: highest priority, then earliest due, then id."""
    return (-row.priority, row.next_processing or 0, row.id)


@dataclass(frozen=True, slots=True)
class Taken:
    """What a lease took, and when the queue next needs a lease: its earliest waiting item's due time and its
    earliest lease expiry (the leases just taken included), both None when there is none."""

    rows: list[InteractionRow]
    next_due: int | None
    next_expiry: int | None


# PostgreSQL: the lease, its ``interaction.changed`` events and what is due next, in one statement (the
# rows just taken are still 'queued' in the statement's snapshot, hence ``NOT IN taken``).
# The items are picked in a MATERIALIZED CTE (see ``store.dialect.picked_once``).
_TAKE_DUE_WITH_EVENTS = text(
    "WITH due AS MATERIALIZED (SELECT id FROM interactions WHERE queue = :queue AND state = 'queued' "
    "AND next_processing <= :now ORDER BY priority DESC, next_processing, id LIMIT :room FOR UPDATE SKIP LOCKED), "
    "taken AS (UPDATE interactions SET state = 'processing', lease_token = :token, lease_expires_at = :expires, "
    "leased_at = :now, worker = :worker, wake = false, attempts = attempts + 1, updated_at = :now "
    "WHERE id IN (SELECT id FROM due) RETURNING *), "
    "ev AS (INSERT INTO events (type, at, subject_kind, subject_id, data) "
    "SELECT 'interaction.changed', :now, 'interaction', taken.id::text, "
    "jsonb_build_object('queue', taken.queue, 'status', 'processing', 'worker', CAST(:worker AS text)) "
    "FROM taken ORDER BY taken.priority DESC, taken.next_processing, taken.id), "
    "upcoming AS (SELECT "
    "(SELECT min(next_processing) FROM interactions WHERE queue = :queue AND state = 'queued' "
    "AND id NOT IN (SELECT id FROM taken)) AS upcoming_due, "
    "(SELECT min(lease_expires_at) FROM interactions WHERE queue = :queue AND state = 'processing') AS upcoming_expiry) "
    "SELECT taken.*, upcoming.upcoming_due, upcoming.upcoming_expiry FROM upcoming LEFT JOIN taken ON true"
).columns(*items.c, column("upcoming_due", Millis), column("upcoming_expiry", Millis))


async def _taken_pg(tx: Transaction, statement: Any, params: dict[str, Any], order: Any) -> Taken:
    """Run a PostgreSQL lease statement (the rows taken, with what is due next on every row) and read it."""
    result = (await tx.execute(statement, params)).all()
    rows = sorted((item_row(r[: len(items.c)]) for r in result if r.id is not None), key=order)
    if rows:
        tx.notify(SEQUENCER_CHANNEL)
    expiry = result[0].upcoming_expiry
    if rows:
        expiry = params["expires"] if expiry is None else min(expiry, params["expires"])
    return Taken(rows, result[0].upcoming_due, expiry)


async def take_due_with_events(tx: Transaction, queue: str, now: int, room: int, token: str, expires: int, worker: str) -> Taken:
    """Lease up to ``room`` due items (skipping rows other transactions hold), oldest due first, with their
    ``interaction.changed`` events; and what is due next."""
    if tx.store.is_postgres:
        params = {"queue": queue, "now": now, "room": room, "token": token, "expires": expires, "worker": worker}
        return await _taken_pg(tx, _TAKE_DUE_WITH_EVENTS, params, pick_order)
    rows = await take_due(tx, queue, now, room, token, expires, worker)
    await outbox.emit_many(tx, [
        outbox.Event("interaction.changed", "interaction", str(r.id), {"queue": queue, "status": "processing", "worker": worker}) for r in rows
    ])
    due, expiry = await next_due_and_expiry(tx, queue)
    return Taken(rows, due, expiry)


# PostgreSQL, a queue without concurrency or rate limits: the whole lease as one statement that is its own
# transaction (autocommit, one round trip) — the queue's row locked shared (never beside an expiry sweep),
# the due items taken only if the queue is not paused, has no expired lease to sweep first and is still
# unlimited, their events, the sequencer's wake-up and what is due next. The queue's row comes back with it,
# so the caller knows which of those held.
_QUEUE_COLUMNS = ", ".join(f"q.{c.name} AS q_{c.name}" for c in queues.c)
_TAKE_DUE_ALONE_CTES = (
    "q AS (SELECT interaction_queues.*, EXISTS (SELECT 1 FROM interactions WHERE queue = :queue AND state = 'processing' "
    "AND lease_expires_at <= :now) AS has_expired FROM interaction_queues WHERE name = :queue FOR SHARE), "
    "go AS (SELECT q.lease_ms, q.processing_timeout_ms FROM q WHERE NOT q.paused AND NOT q.has_expired "
    "AND q.concurrency IS NULL AND q.rate_limit_count IS NULL AND q.owner_by IS NULL AND q.priority_aging_ms IS NULL), "
    "due AS MATERIALIZED (SELECT id FROM interactions WHERE EXISTS (SELECT 1 FROM go) AND queue = :queue "
    "AND state = 'queued' AND next_processing <= :now ORDER BY priority DESC, next_processing, id LIMIT :room "
    "FOR UPDATE SKIP LOCKED), "
    "taken AS (UPDATE interactions SET state = 'processing', lease_token = :token, "
    "lease_expires_at = LEAST(:now + COALESCE(CAST(:lease_ms AS bigint), (SELECT lease_ms FROM go)), "
    ":now + (SELECT processing_timeout_ms FROM go)), "
    "leased_at = :now, worker = :worker, wake = false, attempts = attempts + 1, updated_at = :now "
    "WHERE id IN (SELECT id FROM due) RETURNING *), "
    "ev AS (INSERT INTO events (type, at, subject_kind, subject_id, data) "
    "SELECT 'interaction.changed', :now, 'interaction', taken.id::text, "
    "jsonb_build_object('queue', taken.queue, 'status', 'processing', 'worker', CAST(:worker AS text)) "
    "FROM taken ORDER BY taken.priority DESC, taken.next_processing, taken.id), "
    "wake AS (SELECT pg_notify(:pg_channel, :sequencer) WHERE EXISTS (SELECT 1 FROM taken)), "
    "upcoming AS (SELECT "
    "(SELECT min(next_processing) FROM interactions WHERE queue = :queue AND state = 'queued' "
    "AND id NOT IN (SELECT id FROM taken)) AS upcoming_due, "
    "(SELECT min(lease_expires_at) FROM interactions WHERE queue = :queue AND state = 'processing') AS upcoming_expiry) "
)
_TAKEN_ALONE_COLUMNS = (
    *(column(f"q_{c.name}", c.type) for c in queues.c), column("has_expired"), *items.c,
    column("upcoming_due", Millis), column("upcoming_expiry", Millis),
)
_TAKE_DUE_ALONE = text(
    "WITH " + _TAKE_DUE_ALONE_CTES
    + f"SELECT {_QUEUE_COLUMNS}, q.has_expired, taken.*, upcoming.upcoming_due, upcoming.upcoming_expiry "
    "FROM q CROSS JOIN upcoming LEFT JOIN taken ON true WHERE (SELECT count(*) FROM wake) >= 0"
).columns(*_TAKEN_ALONE_COLUMNS)

# The same after the completions of the last items taken (``release.COMPLETE_HELD_CTES``), in one statement: a
# busy worker's release and its next lease are one round trip and one commit. The completions do not depend on
# the queue's row (a row of their answer stands even when the queue has none); the items they finish were
# processing, so no row is both completed and taken.
_COMPLETE_THEN_TAKE_ALONE = text(
    "WITH " + COMPLETE_HELD_CTES + ", " + _TAKE_DUE_ALONE_CTES
    + f"SELECT {_QUEUE_COLUMNS}, q.has_expired, taken.*, upcoming.upcoming_due, upcoming.upcoming_expiry, "
    "(SELECT array_agg(done.id) FROM done) AS completed "
    "FROM (SELECT 1) AS one LEFT JOIN q ON true CROSS JOIN upcoming LEFT JOIN taken ON true "
    "WHERE (SELECT count(*) FROM wake) >= 0 AND " + DONE_WOKEN
).columns(*_TAKEN_ALONE_COLUMNS, column("completed"))


@dataclass(frozen=True, slots=True)
class TakenAlone:
    """A one-statement lease: the queue as it was locked and, when it let the lease run (not paused, no
    expired lease, no limit), what was taken."""

    queue: QueueRow
    has_expired: bool
    taken: Taken | None


async def take_due_alone(
    tx: Transaction, queue: str, now: int, room: int, token: str, lease_ms: int | None, worker: str
) -> TakenAlone | None:
    """Lease up to ``room`` due items of an unlimited queue as the whole of ``tx`` (PostgreSQL,
    ``tx.may_run_alone``); None when the queue has no row yet."""
    params = {
        "queue": queue, "now": now, "room": room, "token": token, "lease_ms": lease_ms, "worker": worker,
        "pg_channel": PG_CHANNEL, "sequencer": SEQUENCER_CHANNEL,
    }
    return _taken_alone(tx, (await tx.fetch_alone(_TAKE_DUE_ALONE, params)).all())


def _taken_alone(tx: Transaction, result: Sequence[Any]) -> TakenAlone | None:
    """Read a one-statement lease's rows (None: the queue has no row)."""
    if not result or result[0].q_name is None:
        return None
    width = len(queues.c)
    first = result[0]
    q = queue_row(first[:width])
    if q.paused or first.has_expired or q.limited:
        return TakenAlone(q, bool(first.has_expired), None)
    rows = [item_row(r[width + 1 : width + 1 + len(items.c)]) for r in result if r.id is not None]
    rows.sort(key=pick_order)
    expiry = first.upcoming_expiry
    if rows:
        tx.notify(SEQUENCER_CHANNEL)
        expires = rows[0].lease_expires_at
        expiry = expires if expiry is None else min(expiry, expires)  # type: ignore[type-var]
    return TakenAlone(q, False, Taken(rows, first.upcoming_due, expiry))


# SQLite: the due items read level by level of priority (the levels found by skipping through
# ix_interactions_ready, one probe each, as ``_levels_statement``), each level's in the index's (next_processing,
# id) order: a lease reads about ``room`` index entries. Asked for in one ORDER BY, SQLite's planner took every
# due item from ix_interactions_due and sorted them: ~2 ms per lease at 10,000 due items, whatever ``room`` —
# 360 µs per item at the worker's defaults (10 a lease). Reading ix_interactions_ready in order instead walks
# every waiting item when fewer than ``room`` are due (0.7 ms at 10,000 scheduled); by level it does neither.
_TAKE_DUE_SQLITE = text(
    "WITH RECURSIVE levels(p) AS (SELECT (SELECT priority FROM interactions WHERE queue = :queue AND state = 'queued' "
    "ORDER BY priority DESC LIMIT 1) UNION ALL SELECT (SELECT priority FROM interactions WHERE queue = :queue "
    "AND state = 'queued' AND priority < levels.p ORDER BY priority DESC LIMIT 1) FROM levels WHERE levels.p IS NOT NULL), "
    "due AS MATERIALIZED (SELECT id FROM interactions WHERE queue = :queue AND state = 'queued' "
    "AND priority IN (SELECT p FROM levels) AND next_processing <= :now ORDER BY priority DESC, next_processing, id "
    "LIMIT :room) "
    "UPDATE interactions SET state = 'processing', lease_token = :token, lease_expires_at = :expires, leased_at = :now, "
    "worker = :worker, wake = 0, attempts = attempts + 1, updated_at = :now WHERE id IN (SELECT id FROM due) RETURNING "
    + ", ".join(f'"{c.name}"' for c in items.c)
).columns(*items.c)


async def take_due(tx: Transaction, queue: str, now: int, room: int, token: str, expires: int, worker: str) -> list[InteractionRow]:
    """Lease up to ``room`` due items (skipping rows other transactions hold) in one statement, oldest due
    first."""
    if not tx.store.is_postgres:
        params = {"queue": queue, "now": now, "room": room, "token": token, "expires": expires, "worker": worker}
        rows = [item_row(r) for r in (await tx.execute(_TAKE_DUE_SQLITE, params)).all()]
        rows.sort(key=pick_order)
        return rows
    due = (
        select(items.c.id)
        .where(items.c.queue == queue, items.c.state == constant("queued"), items.c.next_processing <= now)
        .order_by(items.c.priority.desc(), items.c.next_processing, items.c.id)
        .limit(room)
    )
    picked = picked_once(tx.store.dialect, due, "due")
    taking = (
        items.update()
        .where(items.c.id.in_(select(picked.c.id)))
        .values(
            state="processing", lease_token=token, lease_expires_at=expires, leased_at=now, worker=worker, wake=False,
            attempts=items.c.attempts + 1, updated_at=now,
        )
        .returning(*items.c)
    )
    rows = [item_row(r) for r in (await tx.execute(taking)).all()]
    rows.sort(key=pick_order)
    return rows


#
# Each read walks an index in its own order and stops early, so a lease costs the same beside a backlog of a
# million: owners are found by skipping from one to the next in ix_interactions_owner_ready (one probe each),
# priority levels the same way, and each owner's (or level's) items come in index order.


async def complete_then_take_alone(
    tx: Transaction, held: Sequence[tuple[int, str, str]], channels: Sequence[str], queue: str, now: int, room: int, token: str,
    lease_ms: int | None, worker: str,
) -> tuple[set[int], TakenAlone | None]:
    """``release.complete_held_alone(held, channels)`` and then ``take_due_alone`` in one statement, the whole of
    ``tx`` (PostgreSQL, ``tx.may_run_alone``): the ids completed, and the lease as ``take_due_alone`` answers it."""
    params = {
        **complete_held_params(held, now, channels),
        "queue": queue, "room": room, "token": token, "lease_ms": lease_ms, "worker": worker, "sequencer": SEQUENCER_CHANNEL,
    }
    result = (await tx.fetch_alone(_COMPLETE_THEN_TAKE_ALONE, params)).all()
    done = {int(i) for i in result[0].completed or ()}
    notify_completed(tx, done, channels)
    return done, _taken_alone(tx, result)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A due item a lease may take, with what its place in the order depends on."""

    id: int
    owner: str
    priority: int
    next_processing: int


def _owner_clause(by_owner: bool) -> str:
    return "AND owner = :owner " if by_owner else ""


def _ready_statement(by_owner: bool, level: bool) -> Any:
    return text(
        "SELECT id, owner, priority, next_processing FROM interactions WHERE queue = :queue " + _owner_clause(by_owner)
        + "AND state = 'queued' " + ("AND priority = :priority " if level else "") + "AND next_processing <= :now ORDER BY "
        + ("" if level else "priority DESC, ") + "next_processing, id LIMIT :k OFFSET :skip"
    )


def _levels_statement(by_owner: bool) -> Any:
    where = "FROM interactions WHERE queue = :queue " + _owner_clause(by_owner) + "AND state = 'queued' "
    return text(
        "WITH RECURSIVE levels(p) AS (SELECT (SELECT priority " + where + "ORDER BY priority DESC LIMIT 1) "
        "UNION ALL SELECT (SELECT priority " + where + "AND priority < levels.p ORDER BY priority DESC LIMIT 1) "
        "FROM levels WHERE levels.p IS NOT NULL) SELECT p FROM levels WHERE p IS NOT NULL"
    )


_READY = {(o, lv): _ready_statement(o, lv) for o in (False, True) for lv in (False, True)}
_LEVELS = {o: _levels_statement(o) for o in (False, True)}


def aged_order(aging_ms: int) -> Any:
    """The order with aging: effective priority ``priority + waited / aging_ms`` highest first — the same as
    ``priority × aging_ms − next_processing`` highest first, which does not move with the clock — then
    earliest due, then id."""
    return lambda c: (c.next_processing - c.priority * aging_ms, c.next_processing, c.id)


async def ready_candidates(
    conn: Executor, queue: str, owner: str | None, now: int, k: int, skip: int = 0, aging_ms: int | None = None
) -> list[Candidate]:
    """The due items of ``queue`` (of one ``owner`` when given) in the lease's order, from the ``skip``-th,
    at most ``k``. With aging, the head of each priority level is read and merged (levels are few: the index
    orders each by due time, and age only ever moves an item ahead of a higher level's later items)."""
    params: dict[str, Any] = {"queue": queue, "owner": owner, "now": now}
    by_owner = owner is not None
    if aging_ms is None:
        rows = (await conn.execute(_READY[by_owner, False], {**params, "k": k, "skip": skip})).all()
        return [Candidate(*r) for r in rows]
    found: list[Candidate] = []
    for (level,) in (await conn.execute(_LEVELS[by_owner], params)).all():
        rows = (await conn.execute(_READY[by_owner, True], {**params, "priority": level, "k": skip + k, "skip": 0})).all()
        found.extend(Candidate(*r) for r in rows)
    found.sort(key=aged_order(aging_ms))
    return found[skip : skip + k]


_HEADS_PG = text(
    "SELECT c.id, c.owner, c.priority, c.next_processing FROM unnest(CAST(:owners AS text[]), CAST(:skips AS integer[]), "
    "CAST(:ks AS integer[])) AS w(owner, skip, k) CROSS JOIN LATERAL (SELECT id, owner, priority, next_processing FROM interactions "
    "WHERE queue = :queue AND owner = w.owner AND state = 'queued' AND next_processing <= :now "
    "ORDER BY priority DESC, next_processing, id LIMIT w.k OFFSET w.skip) AS c"
)


async def owners_heads(
    tx: Transaction, store: Store, queue: str, now: int, wants: dict[str, tuple[int, int]], aging_ms: int | None
) -> dict[str, list[Candidate]]:
    """For each owner, its due items in the lease's order from ``skip``, at most ``k`` (``wants``: owner →
    (skip, k)); one statement on PostgreSQL without aging."""
    heads: dict[str, list[Candidate]] = {o: [] for o in wants}
    wanted = {o: sk for o, sk in wants.items() if sk[1] > 0}
    if not wanted:
        return heads
    if store.is_postgres and aging_ms is None:
        owners = sorted(wanted)
        params = {"queue": queue, "now": now, "owners": owners, "skips": [wanted[o][0] for o in owners], "ks": [wanted[o][1] for o in owners]}
        for r in (await tx.fetch(_HEADS_PG, params)).all():
            heads[r.owner].append(Candidate(*r))
        for found in heads.values():
            found.sort(key=lambda c: (-c.priority, c.next_processing, c.id))
        return heads
    for owner, (skip, k) in wanted.items():
        heads[owner] = await ready_candidates(tx, queue, owner, now, k, skip, aging_ms)
    return heads


_TAKE_IDS_WITH_EVENTS = text(
    str(_TAKE_DUE_WITH_EVENTS).replace(
        "WHERE queue = :queue AND state = 'queued' AND next_processing <= :now ORDER BY priority DESC, next_processing, id LIMIT :room "
        "FOR UPDATE SKIP LOCKED",
        "WHERE id = ANY(CAST(:ids AS bigint[])) AND queue = :queue AND state = 'queued' AND next_processing <= :now FOR UPDATE SKIP LOCKED",
    )
).columns(*items.c, column("upcoming_due", Millis), column("upcoming_expiry", Millis))
assert ":ids" in str(_TAKE_IDS_WITH_EVENTS), "the take-these statement drifted from the take-due one"
# The same, writing the served owners' states (``save_owner_states``) in the same round trip: the owners' trigger
# never fires on a take (it needs a queued row), so no row is written twice in the statement.
_TAKE_IDS_SAVING_OWNERS = text("WITH " + SAVED_OWNERS_CTES.rstrip() + ", " + str(_TAKE_IDS_WITH_EVENTS).removeprefix("WITH ")).columns(
    *items.c, column("upcoming_due", Millis), column("upcoming_expiry", Millis))


async def take_ids_with_events(
    tx: Transaction, queue: str, ids: Sequence[int], now: int, token: str, expires: int, worker: str,
    owners: dict[str, OwnerState] | None = None, fair_clock: int | None = None,
) -> Taken:
    """Lease the items ``ids`` picked (those still due and not held by another transaction), with their events,
    in the order given; and what is due next. With ``owners``, ``save_owner_states(owners, fair_clock)`` first
    (on PostgreSQL in the same statement)."""
    order = {i: n for n, i in enumerate(ids)}
    if tx.store.is_postgres:
        params = {"queue": queue, "ids": list(ids), "now": now, "token": token, "expires": expires, "worker": worker}
        if owners:
            params.update(owner_state_params(queue, owners, fair_clock))
            return await _taken_pg(tx, _TAKE_IDS_SAVING_OWNERS, params, lambda r: order[r.id])
        if fair_clock is not None:
            await save_owner_states(tx, queue, {}, fair_clock)
        return await _taken_pg(tx, _TAKE_IDS_WITH_EVENTS, params, lambda r: order[r.id])
    if owners is not None or fair_clock is not None:
        await save_owner_states(tx, queue, owners or {}, fair_clock)
    taking = (
        items.update()
        .where(tx.store.dialect.any_of(items.c.id, list(ids)), items.c.queue == queue, items.c.state == constant("queued"), items.c.next_processing <= now)
        .values(
            state="processing", lease_token=token, lease_expires_at=expires, leased_at=now, worker=worker, wake=False,
            attempts=items.c.attempts + 1, updated_at=now,
        )
        .returning(*items.c)
    )
    rows = sorted((item_row(r) for r in (await tx.execute(taking)).all()), key=lambda r: order[r.id]) if ids else []
    await outbox.emit_many(tx, [
        outbox.Event("interaction.changed", "interaction", str(r.id), {"queue": queue, "status": "processing", "worker": worker}) for r in rows
    ])
    due, expiry = await next_due_and_expiry(tx, queue)
    return Taken(rows, due, expiry)


# PostgreSQL, a queue with ``owner_by`` + ``fair`` (no aging): the whole lease in one round trip, a function that
# runs the transaction's statements in its order (migration interactions_0014), each with its own snapshot.
_FAIR_LEASE_META = ("status", "q_lease_ms", "q_processing_timeout_ms", "upcoming_due", "upcoming_expiry", "slots", "limited_until")
_FAIR_LEASE = text(
    "SELECT " + ", ".join(f"f.{c}" for c in _FAIR_LEASE_META) + ", (f.item).* FROM mainspring_interactions_fair_lease("
    ":queue, :now, :room, :token, :lease_ms, :worker, :pg_channel, :sequencer, :stride, :settle_read) AS f"
).columns(
    column("status"), column("q_lease_ms", Millis), column("q_processing_timeout_ms", Millis), column("upcoming_due", Millis),
    column("upcoming_expiry", Millis), column("slots"), column("limited_until", Millis), *items.c,
)


@dataclass(frozen=True, slots=True)
class FairLeased:
    """What the one-call fair lease did: ``status`` ok | paused | expired (leases to sweep first) | other (the queue
    is no longer fair, or ages priorities) | missing (no row yet); with ok, what was taken and when to look again."""

    status: str
    lease_ms: int | None
    processing_timeout_ms: int | None
    taken: Taken | None
    slots: int | None
    limited_until: int | None


async def fair_lease_alone(
    tx: Transaction, queue: str, now: int, room: int, token: str, lease_ms: int | None, worker: str, stride: int
) -> FairLeased:
    """Lease up to ``room`` items of a fair owned queue as the whole of ``tx`` (PostgreSQL, ``tx.may_run_alone``)."""
    params = {
        "queue": queue, "now": now, "room": room, "token": token, "lease_ms": lease_ms, "worker": worker,
        "pg_channel": PG_CHANNEL, "sequencer": SEQUENCER_CHANNEL, "stride": stride, "settle_read": SETTLE_READ,
    }
    result = (await tx.fetch_alone(_FAIR_LEASE, params)).all()
    first = result[0]
    width = len(_FAIR_LEASE_META)
    if first.status != "ok":
        return FairLeased(first.status, first.q_lease_ms, first.q_processing_timeout_ms, None, None, None)
    rows = [item_row(r[width:]) for r in result if r.id is not None]
    if rows:
        tx.notify(SEQUENCER_CHANNEL)
    taken = Taken(rows, first.upcoming_due, first.upcoming_expiry)
    return FairLeased("ok", first.q_lease_ms, first.q_processing_timeout_ms, taken, first.slots, first.limited_until)


_NEXT_DUE_AND_EXPIRY = select(
    select(func.min(items.c.next_processing)).where(items.c.queue == bindparam("queue"), items.c.state == constant("queued")).scalar_subquery(),
    select(func.min(items.c.lease_expires_at)).where(items.c.queue == bindparam("queue"), items.c.state == constant("processing")).scalar_subquery(),
)


async def next_due_and_expiry(tx: Executor, queue: str) -> tuple[int | None, int | None]:
    """The earliest due time of ``queue``'s waiting items and the earliest expiry of its leases (one statement)."""
    due, expiry = (await tx.execute(_NEXT_DUE_AND_EXPIRY, {"queue": queue})).one()
    return due, expiry


async def queues_with_expired_leases(conn: Executor, now: int) -> list[str]:
    query = select(items.c.queue).where(items.c.state == constant("processing"), items.c.lease_expires_at <= now).distinct()
    return list((await conn.execute(query)).scalars())


async def earliest_lease_expiry(conn: Executor) -> int | None:
    value = (await conn.execute(select(func.min(items.c.lease_expires_at)).where(items.c.state == constant("processing")))).scalar_one()
    return None if value is None else int(value)
