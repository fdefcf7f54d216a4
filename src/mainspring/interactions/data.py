"""Every statement of the interactions face, answering typed records.

A create is the hot path of the whole face: on PostgreSQL one statement inserts the items and their
``interaction.created`` events together (a data-modifying CTE over ``unnest`` arrays, the same text for any
number of items); on SQLite, which has no round trips to save, one insert per item and one for the events.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, case, column, func, literal, or_, select, text

from mainspring.core import data as core_data
from mainspring.core import finishes, leases, outbox
from mainspring.core.outbox import SEQUENCER_CHANNEL
from mainspring.interactions.tables import interaction_counts as counts
from mainspring.interactions.tables import interaction_owners as owners_table
from mainspring.interactions.tables import interaction_queues as queues
from mainspring.interactions.tables import interaction_schedules as schedules
from mainspring.interactions.tables import interactions as items
from mainspring.store import Store, Transaction, format_time
from mainspring.store import counts as kept_counts
from mainspring.store.dialect import Executor, picked_once
from mainspring.store.notify import PG_CHANNEL, payloads
from mainspring.store.schema import Millis, constant

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


def _item(row: Any) -> InteractionRow:
    return InteractionRow(*row)


def _queue(row: Any) -> QueueRow:
    return QueueRow(*row)


# --- queues ---------------------------------------------------------------------------------------------

RETRY_SETTINGS = ("backoff", "max_delay_ms", "jitter")
"""How a queue delays the retry of a failed attempt (``interactions.retry``)."""
OWNER_SETTINGS = ("priority_aging_ms", "owner_by", "per_owner_concurrency", "per_owner_rate_count", "per_owner_rate_per_ms", "fair", "weights")
"""Priorities that age, owners and their limits, fair shares (``leasing``)."""
QUEUE_SETTINGS = ("rate_limit_count", "rate_limit_per_ms", "concurrency", "lease_ms", "error_delay_ms", "max_attempts",
                  "processing_timeout_ms", "retention_ms", *RETRY_SETTINGS, *OWNER_SETTINGS)
OWNER_FIELDS = ("user", "source", "channel")


_QUEUE = select(queues).where(queues.c.name == bindparam("name"))


def _owner_expression(owner_by: str | None) -> ColumnElement[Any]:
    """An item's owner under ``owner_by`` ('' for a null field, and for every item without ``owner_by``)."""
    if owner_by is None:
        return literal("")
    return func.coalesce(items.c[owner_by], "")


def owner_of(owner_by: str | None, values: dict[str, Any]) -> str:
    return "" if owner_by is None else values.get(owner_by) or ""


async def ensure_queue(tx: Transaction, name: str, defaults: dict[str, Any]) -> None:
    """Create queue ``name`` with ``defaults`` unless it exists (remembered per store: rows are never deleted)."""
    known: set[str] = tx.store.extras.setdefault("interactions:queues", set())
    if name in known:
        return
    now = tx.store.now_ms()
    stmt = tx.store.dialect.insert(queues).values(name=name, created_at=now, updated_at=now, **defaults)
    await tx.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
    tx.after_commit(lambda: known.add(name))


async def put_queue(tx: Transaction, name: str, settings: dict[str, Any]) -> None:
    now = tx.store.now_ms()
    # The row locked first (it may not exist yet: the upsert then inserts it), so the owner's re-keying below
    # sees the queue as it is now.
    before = (await tx.execute(tx.store.dialect.for_update(_QUEUE), {"name": name})).first()
    stmt = tx.store.dialect.insert(queues).values(name=name, created_at=now, updated_at=now, **settings)
    await tx.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={**settings, "updated_at": now}))
    owner_by = settings.get("owner_by")
    if (before.owner_by if before is not None else None) != owner_by:
        # Items waiting are owned by the new field from now on (what is leased keeps its owner until released).
        await tx.execute(
            items.update().where(items.c.queue == name, items.c.state == constant("queued")).values(owner=_owner_expression(owner_by))
        )
        if owner_by is not None:
            # Items whose owner did not change (a null field stays '') fired no trigger: every owner's due time again.
            await tx.execute(_FILL_OWNER_DUES, {"queue": name})
    known: set[str] = tx.store.extras.setdefault("interactions:queues", set())
    tx.after_commit(lambda: known.add(name))


async def set_paused(tx: Transaction, name: str, paused: bool) -> bool:
    """Pause or resume a queue; False when it was so already."""
    statement = queues.update().where(queues.c.name == name, queues.c.paused == (not paused)).values(paused=paused, updated_at=tx.store.now_ms())
    return bool((await tx.execute(statement)).rowcount)


async def get_queue(conn: Executor, name: str) -> QueueRow | None:
    row = (await conn.execute(_QUEUE, {"name": name})).first()
    return None if row is None else _queue(row)


async def lock_queue(tx: Transaction, name: str, *, shared: bool = False) -> QueueRow:
    """The queue's row, locked until commit: exclusively (leases that count limits, expiry, settings are
    serialized on every server), or ``shared`` (leases without limits run side by side, but not beside
    an exclusive holder)."""
    statement = tx.store.dialect.for_share(_QUEUE) if shared else tx.store.dialect.for_update(_QUEUE)
    return _queue((await tx.execute(statement, {"name": name})).one())


# Built once (building it and its cache key cost ~140 µs, per lease: 14 µs per item at the worker's defaults).
_QUEUE_FOR_LEASE = select(
    queues,
    select(items.c.id).where(
        items.c.queue == queues.c.name, items.c.state == constant("processing"),
        items.c.lease_expires_at <= bindparam("expired_by", type_=Millis()),
    ).exists().label("has_expired"),
).where(queues.c.name == bindparam("name"))
_QUEUE_FOR_LEASE_LOCKED: dict[tuple[type, bool], Any] = {}


async def lock_queue_for_lease(tx: Transaction, name: str, now: int, *, shared: bool) -> tuple[QueueRow, bool]:
    """``lock_queue``, and in the same statement whether any of the queue's leases has expired at ``now``
    (a lease then reads the expired rows; most leases need not)."""
    dialect = tx.store.dialect
    statement = _QUEUE_FOR_LEASE_LOCKED.get((type(dialect), shared))
    if statement is None:
        statement = dialect.for_share(_QUEUE_FOR_LEASE) if shared else dialect.for_update(_QUEUE_FOR_LEASE)
        _QUEUE_FOR_LEASE_LOCKED[type(dialect), shared] = statement
    row = (await tx.execute(statement, {"name": name, "expired_by": now})).one()
    return _queue(row[: len(queues.c)]), bool(row.has_expired)


async def queues_by_name(conn: Executor, names: Iterable[str]) -> dict[str, QueueRow]:
    rows = (await conn.execute(select(queues).where(queues.c.name.in_(sorted(set(names)))))).all()
    return {r.name: _queue(r) for r in rows}


async def set_rate_starts(tx: Executor, name: str, starts: Starts) -> None:
    await tx.execute(queues.update().where(queues.c.name == name).values(rate_starts=starts))


async def queue_names(conn: Executor) -> list[str]:
    """Every queue that has a row or an item."""
    named = set((await conn.execute(select(queues.c.name))).scalars())
    # From the counts, not a scan of the items for their distinct queues.
    named |= set((await conn.execute(select(counts.c.queue).group_by(counts.c.queue).having(func.sum(counts.c.n) > 0))).scalars())
    return sorted(named)


def _status_expression(now: int) -> ColumnElement[str]:
    return case(
        (items.c.state != constant("queued"), items.c.state),
        (items.c.next_processing.is_(None), "waiting"),
        (items.c.next_processing > now, "scheduled"),
        else_="ready",
    )


SCHEDULED_CAP = 2_000
"""Queued items a count looks at one by one to split a queue's queued items into ready and scheduled; past
it (on PostgreSQL) the split is the planner's estimate, and labelled so."""


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Items by queue and API status; ``estimated`` names the (queue, status) pairs whose count is an
    estimate (only ready and scheduled can be: every other count is exact)."""

    by_queue: dict[str, dict[str, int]]
    estimated: frozenset[tuple[str, str]]

    def total(self) -> dict[str, int]:
        summed: dict[str, int] = {}
        for counted in self.by_queue.values():
            for status, n in counted.items():
                summed[status] = summed.get(status, 0) + n
        return summed

    def estimated_statuses(self) -> list[str]:
        return sorted({status for _, status in self.estimated})


_STORED_COUNTS = (
    select(counts.c.queue, counts.c.status, func.sum(counts.c.n))
    .group_by(counts.c.queue, counts.c.status)
    .having(func.sum(counts.c.n) != 0)
)

# Per queue: how many queued items are due later, looking at no more than the cap (PostgreSQL: the due index's
# range after now, one queue at a time; a LATERAL join does all the queues in one statement) — and, for the
# queues that reach the cap, how many are due now, capped the same way (the range before now; NULL for the
# others, whose ready items are not looked at).
_SPLIT_CAPPED_PG = text(
    "SELECT q.queue, s.n AS scheduled, CASE WHEN s.n >= :cap THEN r.n END AS ready "
    "FROM unnest(CAST(:queues AS text[])) AS q(queue) CROSS JOIN LATERAL ("
    "SELECT count(*) AS n FROM (SELECT 1 FROM interactions i WHERE i.queue = q.queue AND i.state = 'queued' "
    "AND i.next_processing > :now LIMIT :cap) AS x) AS s CROSS JOIN LATERAL ("
    "SELECT count(*) AS n FROM (SELECT 1 FROM interactions i WHERE s.n >= :cap AND i.queue = q.queue "
    "AND i.state = 'queued' AND i.next_processing <= :now LIMIT :cap) AS y) AS r"
)
_SCHEDULED_ESTIMATE_PG = text(
    "EXPLAIN (FORMAT JSON) SELECT 1 FROM interactions WHERE queue = :queue AND state = 'queued' AND next_processing > :now"
)


async def _scheduled(conn: Executor, now: int, queued: dict[str, int], postgres: bool) -> tuple[dict[str, int], set[str]]:
    """Per queue with queued items, how many of them are scheduled (due later), and the queues where that
    is an estimate."""
    if not queued:
        return {}, set()
    if not postgres:
        # SQLite counts the due index's range itself: microseconds per entry, no network between.
        query = (select(items.c.queue, func.count()).where(items.c.queue.in_(list(queued)), items.c.state == constant("queued"), items.c.next_processing > now)
                 .group_by(items.c.queue))
        return {str(q): int(n) for q, n in (await conn.execute(query)).all()}, set()
    params = {"queues": list(queued), "now": now, "cap": SCHEDULED_CAP}
    split = {str(q): (int(later), ready) for q, later, ready in (await conn.execute(_SPLIT_CAPPED_PG, params)).all()}
    scheduled = {q: later for q, (later, _) in split.items()}
    estimated: set[str] = set()
    for queue, (n, ready) in split.items():
        if n < SCHEDULED_CAP:
            continue
        if ready < SCHEDULED_CAP:
            scheduled[queue] = queued[queue] - ready
            continue
        plan = (await conn.execute(_SCHEDULED_ESTIMATE_PG, {"queue": queue, "now": now})).scalar_one()
        plan = json.loads(plan) if isinstance(plan, str) else plan
        scheduled[queue] = max(SCHEDULED_CAP, min(queued[queue] - SCHEDULED_CAP, int(plan[0]["Plan"]["Plan Rows"])))
        estimated.add(queue)
    return scheduled, estimated


async def count_by_status(conn: Executor, now: int, *, postgres: bool, queue: str | None = None) -> StatusCounts:
    """Items by queue and status: from the counts the triggers keep (exact), queued ones split into ready
    and scheduled by ``now``."""
    query = _STORED_COUNTS if queue is None else _STORED_COUNTS.where(counts.c.queue == queue)
    by_queue: dict[str, dict[str, int]] = {}
    for q, status, n in (await conn.execute(query)).all():
        by_queue.setdefault(str(q), {})[str(status)] = int(n)
    queued = {q: c.pop("queued") for q, c in by_queue.items() if "queued" in c}
    scheduled, estimated = await _scheduled(conn, now, queued, postgres)
    for q, n in queued.items():
        later = scheduled.get(q, 0)
        by_queue[q]["scheduled"] = later
        by_queue[q]["ready"] = n - later
    return StatusCounts(by_queue, frozenset((q, s) for q in estimated for s in ("ready", "scheduled")))


async def fold_counts(tx: Executor) -> int:
    """PostgreSQL: fold the count rows of backends that are gone into slot 0 (``store.counts.fold``)."""
    return await kept_counts.fold(tx, counts)


async def oldest_ready(conn: Executor, now: int) -> dict[str, int]:
    """Per queue, since when its oldest ready item has been due (epoch ms): the first entry of each queue's
    range of the due index, not a scan of every ready item."""
    queued = (select(counts.c.queue).where(counts.c.status == "queued").group_by(counts.c.queue)
              .having(func.sum(counts.c.n) > 0).subquery("queued"))
    first_due = (select(func.min(items.c.next_processing))
                 .where(items.c.queue == queued.c.queue, items.c.state == constant("queued"), items.c.next_processing <= now)
                 .scalar_subquery())
    rows = (await conn.execute(select(queued.c.queue, first_due))).all()
    return {str(q): int(t) for q, t in rows if t is not None}


async def queues_with_retention(conn: Executor) -> list[tuple[str, int]]:
    rows = (await conn.execute(select(queues.c.name, queues.c.retention_ms).where(queues.c.retention_ms.is_not(None)))).all()
    return [(r.name, int(r.retention_ms)) for r in rows]


# --- create ---------------------------------------------------------------------------------------------

_UNNEST_COLUMNS = (
    ("queue", "text"),
    ("parent_id", "bigint"),
    ("name", "text"),
    ("message_id", "text"),
    ("channel", "text"),
    ("user", "text"),
    ("source", "text"),
    ("data", "jsonb"),
    ("state", "text"),
    ("next_processing", "bigint"),
    ("created_at", "bigint"),
    ("updated_at", "bigint"),
    ("trace_parent", "text"),
    ("priority", "integer"),
)

# The items and their events in one statement. Events are inserted in id order, so the sequencer numbers
# them in the order the items were created; a message_id already used in the queue inserts nothing.
_CREATE_WITH_EVENTS = text(
    "WITH ins AS (INSERT INTO interactions ("
    + ", ".join(f'"{c}"' for c, _ in _UNNEST_COLUMNS)
    + ", owner, attempts) SELECT u.*, COALESCE((SELECT CASE q.owner_by WHEN 'user' THEN u.\"user\" WHEN 'source' THEN u.source "
    "WHEN 'channel' THEN u.channel END FROM interaction_queues AS q WHERE q.name = u.queue), ''), 0 FROM unnest("
    + ", ".join(f"CAST(:{c} AS {t}[])" for c, t in _UNNEST_COLUMNS)
    + ") AS u(" + ", ".join(f'"{c}"' for c, _ in _UNNEST_COLUMNS) + ") ON CONFLICT (queue, message_id) DO NOTHING RETURNING *), "
    "ev AS (INSERT INTO events (type, at, subject_kind, subject_id, data) "
    "SELECT 'interaction.created', ins.created_at, 'interaction', ins.id::text, jsonb_build_object("
    "'queue', ins.queue, "
    "'status', CASE WHEN ins.next_processing > :now THEN 'scheduled' ELSE 'ready' END, "
    "'next_processing', " + core_data.RFC3339_SQL.format(ms="ins.next_processing") + ") "
    "FROM ins ORDER BY ins.id) "
    "SELECT * FROM ins ORDER BY id"
).columns(*items.c)

# The same in a caller's own transaction: the events staged, numbered at its commit (migration interactions_0017).
_CREATE_WITH_EVENTS_AT_COMMIT = text(
    str(_CREATE_WITH_EVENTS).replace("ev AS (INSERT INTO events ", "ev AS (INSERT INTO events_at_commit ", 1)
).columns(*items.c)

# The same as a whole transaction of its own (autocommit, one round trip): it also sends the wake-ups to
# other servers, delivered when it commits, if it inserted anything.
_CREATE_WITH_EVENTS_ALONE = text(
    str(_CREATE_WITH_EVENTS).removesuffix("SELECT * FROM ins ORDER BY id")
    + ", wake AS (SELECT pg_notify(:pg_channel, channel) FROM unnest(CAST(:channels AS text[])) AS channel "
    "WHERE EXISTS (SELECT 1 FROM ins)) "
    "SELECT * FROM ins WHERE (SELECT count(*) FROM wake) >= 0 ORDER BY id"
).columns(*items.c)

# The owner under the queue's ``owner_by`` as the inserting statement sees it, read inside that statement
# (no statement of its own per item). Its own bind names: the INSERT's columns reserve theirs.
_OWNER_OF_NEW = func.coalesce(
    select(case(
        (queues.c.owner_by == "user", bindparam("o_user", type_=items.c.user.type)),
        (queues.c.owner_by == "source", bindparam("o_source", type_=items.c.source.type)),
        (queues.c.owner_by == "channel", bindparam("o_channel", type_=items.c.channel.type)),
        else_=literal(""),
    )).where(queues.c.name == bindparam("o_queue", type_=queues.c.name.type)).scalar_subquery(),
    "",
)
_INSERT_ONE = items.insert().values(owner=_OWNER_OF_NEW).returning(*items.c)
_INSERT_KEYED: dict[str, Any] = {}
"""Per engine (ON CONFLICT is engine syntax): an insert that does nothing when the message_id is used."""
_BY_MESSAGE_ID = select(items).where(items.c.queue == bindparam("queue"), items.c.message_id == bindparam("message_id"))


def _values(new: NewInteraction, now: int) -> dict[str, Any]:
    return {
        "queue": new.queue,
        "parent_id": new.parent_id,
        "name": new.name,
        "message_id": new.message_id,
        "channel": new.channel,
        "user": new.user,
        "source": new.source,
        "data": new.data,
        "result": new.result if new.completed else None,
        "error": None,
        "state": "completed" if new.completed else "queued",
        "next_processing": None if new.completed else (now if new.due_at is None else new.due_at),
        "attempts": 0,
        "created_at": now,
        "updated_at": now,
        "finished_at": now if new.completed else None,
        "trace_parent": new.trace_parent,
        "priority": new.priority,
    }


async def insert_queued_with_events(
    tx: Transaction, batch: Sequence[NewInteraction], now: int, wake: Sequence[str] = ()
) -> list[InteractionRow | None]:
    """Insert not-completed interactions with their ``interaction.created`` events; answers, per item, the
    new row, or None where its ``message_id`` was already used in its queue. ``wake``: the channels the
    caller notifies once it inserted; on PostgreSQL, a transaction that may run this statement alone does
    (one round trip), and the statement then sends them itself."""
    if not tx.store.is_postgres:
        inserted = [await _insert_one(tx, _owned_values(new, now)) for new in batch]
        await outbox.emit_many(tx, [created_event(row, now) for row in inserted if row is not None])
        return inserted
    values = [_values(new, now) for new in batch]
    params: dict[str, Any] = {c: [v[c] for v in values] for c, _ in _UNNEST_COLUMNS}
    params["data"] = [None if d is None else json.dumps(d) for d in params["data"]]
    params["now"] = now
    if tx.may_run_alone:
        # One NOTIFY for the readers of events and the queues' workers (as many as the payload limit needs).
        params.update(pg_channel=PG_CHANNEL, channels=payloads([SEQUENCER_CHANNEL, *wake]))
        rows = [_item(r) for r in (await tx.fetch_alone(_CREATE_WITH_EVENTS_ALONE, params)).all()]
    else:
        statement = _CREATE_WITH_EVENTS_AT_COMMIT if tx.events_at_commit else _CREATE_WITH_EVENTS
        rows = [_item(r) for r in (await tx.execute(statement, params)).all()]
    if rows:
        tx.notify(SEQUENCER_CHANNEL)
    # Rows come in array order minus the skipped ones, so a skipped item is one whose message_id is not next.
    answers: list[InteractionRow | None] = []
    pending = iter(rows)
    upcoming = next(pending, None)
    for new in batch:
        if upcoming is not None and (new.message_id is None or upcoming.message_id == new.message_id):
            answers.append(upcoming)
            upcoming = next(pending, None)
        else:
            answers.append(None)
    return answers


def created_event(row: InteractionRow, now: int) -> outbox.Event:
    return outbox.Event(
        "interaction.created", "interaction", str(row.id),
        {"queue": row.queue, "status": row.status(now), "next_processing": format_time(row.next_processing)},
    )


async def _insert_one(tx: Transaction, values: dict[str, Any]) -> InteractionRow | None:
    if values["message_id"] is None:
        return _item((await tx.execute(_INSERT_ONE, values)).one())
    # The unique (queue, message_id) constraint decides between racing creators, on any server.
    stmt = _INSERT_KEYED.get(tx.store.dialect.name)
    if stmt is None:
        stmt = _INSERT_KEYED[tx.store.dialect.name] = (
            tx.store.dialect.insert(items).values(owner=_OWNER_OF_NEW)
            .on_conflict_do_nothing(index_elements=["queue", "message_id"]).returning(*items.c)
        )
    row = (await tx.execute(stmt, values)).first()
    return None if row is None else _item(row)


def _owned_values(new: NewInteraction, now: int) -> dict[str, Any]:
    """The values of ``new`` and what ``_OWNER_OF_NEW`` reads its owner from."""
    return {**_values(new, now), "o_user": new.user, "o_source": new.source, "o_channel": new.channel, "o_queue": new.queue}


async def insert_one(tx: Transaction, new: NewInteraction, now: int) -> InteractionRow | None:
    """Insert one interaction (any kind, completed too) without events; None when its message_id was used."""
    return await _insert_one(tx, _owned_values(new, now))


async def by_message_id(conn: Executor, queue: str, message_id: str) -> InteractionRow | None:
    row = (await conn.execute(_BY_MESSAGE_ID, {"queue": queue, "message_id": message_id})).first()
    return None if row is None else _item(row)


async def existing_ids(conn: Transaction, ids: Iterable[int]) -> set[int]:
    wanted = sorted(set(ids))
    if not wanted:
        return set()
    return set((await conn.execute(select(items.c.id).where(conn.store.dialect.any_of(items.c.id, wanted)))).scalars())


# --- one item -------------------------------------------------------------------------------------------

_BY_ID = select(items).where(items.c.id == bindparam("id"))


async def get(conn: Executor, item_id: int) -> InteractionRow | None:
    row = (await conn.execute(_BY_ID, {"id": item_id})).first()
    return None if row is None else _item(row)


async def lock(tx: Transaction, item_id: int) -> InteractionRow | None:
    """The item, its row locked until commit."""
    row = (await tx.execute(tx.store.dialect.for_update(_BY_ID), {"id": item_id})).first()
    return None if row is None else _item(row)


async def lock_many(tx: Transaction, ids: Iterable[int]) -> dict[int, InteractionRow]:
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = (await tx.execute(tx.store.dialect.for_update(select(items).where(tx.store.dialect.any_of(items.c.id, wanted))))).all()
    return {r.id: _item(r) for r in rows}


@dataclass(frozen=True, slots=True)
class Fence:
    """What a release needs to know of a held item before it changes it."""

    id: int
    queue: str
    parent_id: int | None
    state: str
    lease_token: str | None
    lease_expires_at: int | None
    message_id: str | None
    """A watched one (``core.finishes``) is finished on the path that reports it."""

    def held_by(self, token: str, now: int) -> bool:
        return self.state == "processing" and leases.is_held(self.lease_token, self.lease_expires_at, token, now)


_FENCE_COLUMNS = [items.c[f.name] for f in dataclasses.fields(Fence)]


async def lock_fences(tx: Transaction, ids: Iterable[int]) -> dict[int, Fence]:
    """Lock these items (PostgreSQL; SQLite's writer holds them all) and read their lease fences only —
    not their data, results and errors, which a batch of completions does not need."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    query = select(*_FENCE_COLUMNS).where(tx.store.dialect.any_of(items.c.id, wanted))
    return {r.id: Fence(*r) for r in (await tx.execute(tx.store.dialect.for_update(query))).all()}


async def update(tx: Executor, item_id: int, **values: Any) -> InteractionRow:
    """Change one item; answers it as changed."""
    return _item((await tx.execute(items.update().where(items.c.id == item_id).values(**values).returning(*items.c))).one())


async def update_many(tx: Transaction, ids: Sequence[int], **values: Any) -> None:
    if ids:
        await tx.execute(items.update().where(tx.store.dialect.any_of(items.c.id, ids)).values(**values))


async def complete_with_results(tx: Executor, results: Sequence[tuple[int, Any]], **values: Any) -> None:
    """Complete items, each with its own result, in one executemany."""
    if not results:
        return
    stmt = (
        items.update()
        .where(items.c.id == bindparam("b_id"))
        .values(state="completed", result=bindparam("b_result", type_=items.c.result.type), **values)
    )
    await tx.execute(stmt, [{"b_id": i, "b_result": r} for i, r in results])


# PostgreSQL: complete held, parentless, childless items with their results and ``interaction.completed``
# events, as a whole transaction of its own (autocommit, one round trip, with its wake-ups). The fence is in
# the UPDATE, so it is checked again on the row's newest version if another transaction changed it first;
# items it leaves alone (a lost lease, a parent to wake, children to cancel) are the caller's to release.
_COMPLETE_HELD_ALONE = text(
    "WITH fence AS (SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS text[]), CAST(:results AS text[])) "
    "AS f(id, token, result)), "
    "done AS (UPDATE interactions AS i SET state = 'completed', result = CAST(fence.result AS jsonb), next_processing = NULL, "
    "lease_token = NULL, lease_expires_at = NULL, finished_at = :now, updated_at = :now FROM fence "
    "WHERE i.id = ANY(CAST(:ids AS bigint[])) AND i.id = fence.id AND i.state = 'processing' AND i.lease_token = fence.token "
    "AND i.lease_expires_at > :now "
    "AND i.parent_id IS NULL AND (i.message_id IS NULL OR NOT (i.message_id LIKE ANY(CAST(:watched AS text[])))) "
    "AND NOT EXISTS (SELECT 1 FROM interactions AS c WHERE c.parent_id = i.id AND c.state IN ('queued', 'processing')) "
    "RETURNING i.id, i.queue), "
    "ev AS (INSERT INTO events (type, at, subject_kind, subject_id, data) "
    "SELECT 'interaction.completed', :now, 'interaction', done.id::text, "
    "jsonb_build_object('queue', done.queue, 'status', 'completed', 'failed', false) FROM done ORDER BY done.id), "
    "wake AS (SELECT pg_notify(:pg_channel, channel) FROM unnest(CAST(:channels AS text[])) AS channel "
    "WHERE EXISTS (SELECT 1 FROM done)) "
    "SELECT done.id FROM done WHERE (SELECT count(*) FROM wake) >= 0"
)


async def complete_held_alone(tx: Transaction, held: Sequence[tuple[int, str, str]], now: int, channels: Sequence[str]) -> set[int]:
    """Complete each (id, token, result as JSON text) whose lease ``token`` still holds, if the item has no
    parent and no unfinished children, as the whole of ``tx`` (PostgreSQL, ``tx.may_run_alone``); answers the
    ids completed. ``channels`` are woken if any was."""
    params = {
        "ids": [i for i, _, _ in held], "tokens": [t for _, t, _ in held], "results": [r for _, _, r in held], "now": now,
        "pg_channel": PG_CHANNEL, "channels": [SEQUENCER_CHANNEL, *channels], "watched": finishes.like_patterns(),
    }
    done = {int(r.id) for r in (await tx.fetch_alone(_COMPLETE_HELD_ALONE, params)).all()}
    if done:
        tx.notify(SEQUENCER_CHANNEL)
        for channel in channels:
            tx.notify(channel)
    return done


# PostgreSQL: every extension in one statement, so the count trigger (once per UPDATE statement, migration
# interactions_0013) runs once for the batch rather than once per lease.
_EXTEND_LEASES_PG = text(
    "UPDATE interactions AS i SET lease_expires_at = f.expires "
    "FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS text[]), CAST(:expires AS bigint[])) AS f(id, token, expires) "
    "WHERE i.id = f.id AND i.lease_token = f.token"
)


async def extend_leases(tx: Transaction, leases: Sequence[tuple[int, str, int]]) -> None:
    """Set the expiry of each (id, token, expires) lease still held with that token."""
    if not leases:
        return
    if tx.store.is_postgres:
        params = {"ids": [i for i, _, _ in leases], "tokens": [t for _, t, _ in leases], "expires": [e for _, _, e in leases]}
        await tx.execute(_EXTEND_LEASES_PG, params)
        return
    stmt = (
        items.update()
        .where(items.c.id == bindparam("b_id"), items.c.lease_token == bindparam("b_token"))
        .values(lease_expires_at=bindparam("b_expires"))
    )
    await tx.execute(stmt, [{"b_id": i, "b_token": t, "b_expires": e} for i, t, e in leases])


async def queues_of(conn: Executor, ids: Iterable[int]) -> dict[int, str]:
    """The queue of each item in ``ids`` that exists."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = (await conn.execute(select(items.c.id, items.c.queue).where(items.c.id.in_(wanted)))).all()
    return {r.id: r.queue for r in rows}


async def held_leases(conn: Executor, ids: Iterable[int]) -> dict[int, tuple[str, str | None]]:
    """(state, lease token) of each item in ``ids``."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = (await conn.execute(select(items.c.id, items.c.state, items.c.lease_token).where(items.c.id.in_(wanted)))).all()
    return {r.id: (r.state, r.lease_token) for r in rows}


# --- parents and children -------------------------------------------------------------------------------


async def lock_active(tx: Transaction, ids: Iterable[int]) -> list[InteractionRow]:
    wanted = sorted(set(ids))
    if not wanted:
        return []
    query = select(items).where(tx.store.dialect.any_of(items.c.id, wanted), items.c.state.in_(ACTIVE))
    return [_item(r) for r in (await tx.execute(tx.store.dialect.for_update(query))).all()]


async def lock_active_children(tx: Transaction, parent_ids: Sequence[int]) -> list[InteractionRow]:
    query = select(items).where(tx.store.dialect.any_of(items.c.parent_id, parent_ids), items.c.state.in_(ACTIVE))
    return [_item(r) for r in (await tx.execute(tx.store.dialect.for_update(query))).all()]


async def children(
    conn: Executor, parent_id: int, name: str | None, limit: int, after: tuple[int, int] | None
) -> list[InteractionRow]:
    """Children oldest first; ``after`` is the (created_at, id) keyset position to continue after."""
    query = select(items).where(items.c.parent_id == parent_id)
    if name is not None:
        query = query.where(items.c.name == name)
    if after is not None:
        created, last = after
        query = query.where(or_(items.c.created_at > created, and_(items.c.created_at == created, items.c.id > last)))
    query = query.order_by(items.c.created_at, items.c.id).limit(limit)
    return [_item(r) for r in (await conn.execute(query)).all()]


async def latest_child(conn: Executor, parent_id: int, name: str | None) -> InteractionRow | None:
    query = select(items).where(items.c.parent_id == parent_id)
    if name is not None:
        query = query.where(items.c.name == name)
    row = (await conn.execute(query.order_by(items.c.created_at.desc(), items.c.id.desc()).limit(1))).first()
    return None if row is None else _item(row)


# --- lists ----------------------------------------------------------------------------------------------


def status_filter(status: str, now: int) -> ColumnElement[bool]:
    if status == "waiting":
        return and_(items.c.state == constant("queued"), items.c.next_processing.is_(None))
    if status == "scheduled":
        return and_(items.c.state == constant("queued"), items.c.next_processing > now)
    if status == "ready":
        return and_(items.c.state == constant("queued"), items.c.next_processing <= now)
    return items.c.state == status


async def list_items(
    conn: Executor, now: int, *, queue: str | None, filters: dict[str, Any], statuses: Sequence[str], limit: int,
    after_id: int | None, newest_first: bool = False,
) -> list[InteractionRow]:
    """Items filtered by exact field values and statuses, keyset-paged by id."""
    query = select(items)
    if queue is not None:
        query = query.where(items.c.queue == queue)
    for key, value in filters.items():
        if value is not None:
            query = query.where(items.c[key] == value)
    if statuses:
        query = query.where(or_(*(status_filter(s, now) for s in statuses)))
    if after_id is not None:
        query = query.where(items.c.id < after_id if newest_first else items.c.id > after_id)
    query = query.order_by(items.c.id.desc() if newest_first else items.c.id).limit(limit)
    return [_item(r) for r in (await conn.execute(query)).all()]


async def ancestors(conn: Executor, parent_id: int | None, depth: int) -> list[InteractionRow]:
    """The chain of parents from ``parent_id`` up, nearest first (at most ``depth``)."""
    found: list[InteractionRow] = []
    while parent_id is not None and len(found) < depth:
        row = await get(conn, parent_id)
        if row is None:
            break
        found.append(row)
        parent_id = row.parent_id
    return found


# --- leases ---------------------------------------------------------------------------------------------


async def expired_leases(tx: Transaction, queue: str, now: int) -> list[InteractionRow]:
    query = select(items).where(items.c.queue == queue, items.c.state == constant("processing"), items.c.lease_expires_at <= now)
    return [_item(r) for r in (await tx.execute(tx.store.dialect.skip_locked(query))).all()]


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
    rows = sorted((_item(r[: len(items.c)]) for r in result if r.id is not None), key=order)
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
_TAKE_DUE_ALONE = text(
    "WITH q AS (SELECT interaction_queues.*, EXISTS (SELECT 1 FROM interactions WHERE queue = :queue AND state = 'processing' "
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
    f"SELECT {_QUEUE_COLUMNS}, q.has_expired, taken.*, upcoming.upcoming_due, upcoming.upcoming_expiry "
    "FROM q CROSS JOIN upcoming LEFT JOIN taken ON true WHERE (SELECT count(*) FROM wake) >= 0"
).columns(
    *(column(f"q_{c.name}", c.type) for c in queues.c), column("has_expired"), *items.c,
    column("upcoming_due", Millis), column("upcoming_expiry", Millis),
)


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
    result = (await tx.fetch_alone(_TAKE_DUE_ALONE, params)).all()
    if not result:
        return None
    width = len(queues.c)
    first = result[0]
    q = _queue(first[:width])
    if q.paused or first.has_expired or q.limited:
        return TakenAlone(q, bool(first.has_expired), None)
    rows = [_item(r[width + 1 : width + 1 + len(items.c)]) for r in result if r.id is not None]
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
        rows = [_item(r) for r in (await tx.execute(_TAKE_DUE_SQLITE, params)).all()]
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
    rows = [_item(r) for r in (await tx.execute(taking)).all()]
    rows.sort(key=pick_order)
    return rows


# --- picks by priority, age and owner (queues with ``owner_by`` or ``priority_aging_ms``) ------------------
#
# Each read walks an index in its own order and stops early, so a lease costs the same beside a backlog of a
# million: owners are found by skipping from one to the next in ix_interactions_owner_ready (one probe each),
# priority levels the same way, and each owner's (or level's) items come in index order.


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


# Owners with an item due, one index probe per owner: the next owner name after the last one found.
_OWNERS_DUE = text(
    "WITH RECURSIVE o(owner) AS ("
    "SELECT (SELECT owner FROM interactions WHERE queue = :queue AND state = 'queued' ORDER BY owner LIMIT 1) "
    "UNION ALL SELECT (SELECT i.owner FROM interactions AS i WHERE i.queue = :queue AND i.state = 'queued' AND i.owner > o.owner "
    "ORDER BY i.owner LIMIT 1) FROM o WHERE o.owner IS NOT NULL) "
    "SELECT o.owner FROM o WHERE o.owner IS NOT NULL AND EXISTS (SELECT 1 FROM interactions AS d WHERE d.queue = :queue "
    "AND d.owner = o.owner AND d.state = 'queued' AND d.next_processing <= :now)"
)


async def owners_with_due(conn: Executor, queue: str, now: int) -> list[str]:
    return [r[0] for r in (await conn.execute(_OWNERS_DUE, {"queue": queue, "now": now})).all()]


_PROCESSING_BY_OWNER = text("SELECT owner, count(*) FROM interactions WHERE queue = :queue AND state = 'processing' GROUP BY owner")


async def processing_by_owner(tx: Transaction, queue: str) -> dict[str, int]:
    return {str(o): int(n) for o, n in (await tx.fetch(_PROCESSING_BY_OWNER, {"queue": queue})).all()}


@dataclass(slots=True)
class OwnerState:
    """An owner's recent lease starts (its rate log, ``leasing.rate_left``) and turn (``interaction_owners``), as a
    lease changes them."""

    rate_starts: Starts | None = None
    turn: int = 0


def _starts(value: Any) -> Starts | None:
    """A rate log as a statement read it: decoded already, or JSON text (a textual statement's column)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


async def owner_states(tx: Transaction, queue: str, owners: Sequence[str]) -> dict[str, OwnerState]:
    if not owners:
        return {}
    query = select(owners_table.c.owner, owners_table.c.rate_starts, owners_table.c.turn).where(
        owners_table.c.queue == queue, tx.store.dialect.any_of(owners_table.c.owner, sorted(owners))
    )
    return {r.owner: OwnerState(_starts(r.rate_starts), int(r.turn)) for r in (await tx.execute(query)).all()}


_OWNERS_IN_TURN = (
    "SELECT owner, rate_starts, turn FROM interaction_owners WHERE queue = :queue AND next_due IS NOT NULL "
    "AND next_due <= :now {after}ORDER BY turn, owner LIMIT :n"
)
_OWNERS_IN_TURN_AFTER = "AND (turn > :turn OR (turn = :turn AND owner > :owner)) "
_OWNERS_IN_TURN_STATEMENTS = {paged: text(_OWNERS_IN_TURN.format(after=_OWNERS_IN_TURN_AFTER if paged else "")) for paged in (False, True)}


async def owners_in_turn(tx: Transaction, queue: str, now: int, after: tuple[int, str] | None, n: int) -> list[tuple[str, OwnerState]]:
    """The next ``n`` owners of ``queue`` that may have something due, in turn order (after ``after``: a turn and an
    owner). Read without a lock: the leases that write these rows hold the queue's row lock."""
    params: dict[str, Any] = {"queue": queue, "now": now, "n": n}
    if after is not None:
        params.update(turn=after[0], owner=after[1])
    rows = (await tx.fetch(_OWNERS_IN_TURN_STATEMENTS[after is not None], params)).all()
    return [(r.owner, OwnerState(_starts(r.rate_starts), int(r.turn))) for r in rows]


SETTLE_READ = 1000
"""At most this many of an owner's queued items are read to find its next due time."""

# The owner's queued items read in the order of its index (ix_interactions_owner_ready), so that index is the one
# read whatever the statistics say (a plain ``min(next_processing)`` walked the whole queue's due index, past every
# item of a flooding owner, to find that a small one has nothing). An owner with more queued items than that gets
# ``:now``: nothing of it was due at the lease (a lower bound), so it is looked at again by the next lease.
_SETTLE_DUE = text(
    "UPDATE interaction_owners SET next_due = (SELECT CASE WHEN count(*) < :most THEN min(s.next_processing) ELSE :now END FROM "
    "(SELECT next_processing FROM interactions WHERE queue = :queue AND owner = :owner AND state = 'queued' "
    "ORDER BY priority DESC, next_processing, id LIMIT :most) AS s) WHERE queue = :queue AND owner = :owner"
)


_LOCK_OWNERS_FREE = text(
    "SELECT owner FROM interaction_owners WHERE queue = :queue AND owner = ANY(CAST(:owners AS text[])) ORDER BY owner FOR UPDATE SKIP LOCKED"
)


async def settle_owner_dues(tx: Transaction, queue: str, owners: Iterable[str], now: int) -> None:
    """Set the owners' ``next_due`` to the earliest due time of their queued items (NULL: none), under their row
    locks, taken first: a writer that queued an item for one of them has committed (its trigger's upsert held the
    row), or waits for this commit and lowers it again. On PostgreSQL a row a writer holds now is left as it is
    (a lower bound stays true): a lease never waits on a create."""
    mine = sorted(owners)
    if tx.store.is_postgres:
        mine = list((await tx.execute(_LOCK_OWNERS_FREE, {"queue": queue, "owners": mine})).scalars())
    if mine:
        await tx.execute(_SETTLE_DUE, [{"queue": queue, "owner": o, "now": now, "most": SETTLE_READ} for o in mine])


_LOCK_IDLE_OWNERS = (
    "SELECT o.owner, o.rate_starts, q.per_owner_rate_per_ms FROM interaction_owners AS o JOIN interaction_queues AS q ON q.name = o.queue "
    "WHERE o.queue = :queue AND o.owner > :after AND (o.next_due IS NULL OR o.next_due <= :now) AND o.turn <= q.fair_clock "
    "ORDER BY o.owner LIMIT :n"
)
_DELETE_IDLE_OWNERS = text(
    "DELETE FROM interaction_owners WHERE queue = :queue AND owner = :owner AND next_due IS NULL"
)
OWNER_WINDOW_MARGIN_MS = 60_000
"""How long after it leaves the rate window an owner's latest start is still kept (for a server whose clock runs behind)."""


async def prune_idle_owners(tx: Transaction, queue: str, now: int, after: str, batch: int) -> tuple[str | None, int]:
    """Delete owner rows of ``queue`` that say nothing a missing row would not: nothing queued, a turn the queue's
    clock has passed (a missing row starts at the clock), no rate window in effect. Looks at up to ``batch`` rows
    after the owner ``after``; answers the owner to look after next (None: from the first) and how many were deleted.
    Runs under the queue's row lock, like the leases that write these rows."""
    sql = _LOCK_IDLE_OWNERS + (" FOR UPDATE OF o" if tx.store.is_postgres else "")
    looked = (await tx.execute(text(sql), {"queue": queue, "now": now, "after": after, "n": batch})).all()
    if not looked:
        return None, 0
    # A start still in its window (with the margin) keeps the row: a missing row would let the owner start again.
    owners = [r.owner for r in looked
              if r.per_owner_rate_per_ms is None or not (starts := _starts(r.rate_starts)) or starts[-1][0] + r.per_owner_rate_per_ms <= now - OWNER_WINDOW_MARGIN_MS]
    # The next call begins after the last one looked at, or from the first again once this reached the end.
    last = looked[-1].owner if len(looked) == batch else None
    if not owners:
        return last, 0
    # Held now (FOR UPDATE waited for the writers in flight): one queuing an item for them later waits for this
    # commit, then inserts the row again.
    await tx.execute(_SETTLE_DUE, [{"queue": queue, "owner": o, "now": now, "most": SETTLE_READ} for o in owners])
    deleted = 0
    for owner in owners:
        deleted += (await tx.execute(_DELETE_IDLE_OWNERS, {"queue": queue, "owner": owner})).rowcount
    return last, deleted


async def queues_with_owner_rows(conn: Executor) -> list[str]:
    query = select(queues.c.name).where(select(owners_table.c.queue).where(owners_table.c.queue == queues.c.name).exists()).order_by(queues.c.name)
    return list((await conn.execute(query)).scalars())


_FILL_OWNER_DUES = text(
    "INSERT INTO interaction_owners (queue, owner, next_due) SELECT i.queue, i.owner, min(i.next_processing) "
    "FROM interactions AS i WHERE i.queue = :queue AND i.state = 'queued' AND i.next_processing IS NOT NULL "
    "GROUP BY i.queue, i.owner ORDER BY i.owner ON CONFLICT (queue, owner) DO UPDATE SET next_due = excluded.next_due "
    "WHERE interaction_owners.next_due IS NULL OR interaction_owners.next_due > excluded.next_due"
)


# One statement for all the owners a lease served (an executemany runs one upsert per owner on the server: up to
# ``room`` of them, the largest part of a fair lease's time), and the queue's fair clock with it (NULL: unchanged).
# In owner order, as every writer of these rows locks them.
_SAVED_OWNERS_CTES = (
    "clock AS (UPDATE interaction_queues SET fair_clock = CAST(:clock AS bigint) WHERE name = :queue AND CAST(:clock AS bigint) IS NOT NULL), "
    "saved AS (INSERT INTO interaction_owners (queue, owner, rate_starts, turn) "
    "SELECT :queue, s.owner, CAST(s.rate_starts AS jsonb), s.turn FROM unnest(CAST(:owners AS text[]), "
    "CAST(:starts AS text[]), CAST(:turns AS bigint[])) AS s(owner, rate_starts, turn) "
    "ORDER BY s.owner ON CONFLICT (queue, owner) DO UPDATE SET rate_starts = excluded.rate_starts, turn = excluded.turn) "
)
_SAVE_OWNER_STATES = text("WITH " + _SAVED_OWNERS_CTES + "SELECT 1")


def _owner_state_params(queue: str, states: dict[str, OwnerState], fair_clock: int | None) -> dict[str, Any]:
    ordered = sorted(states.items())
    return {"queue": queue, "clock": fair_clock, "owners": [o for o, _ in ordered],
            "starts": [None if st.rate_starts is None else json.dumps(st.rate_starts) for _, st in ordered], "turns": [st.turn for _, st in ordered]}


async def save_owner_states(tx: Transaction, queue: str, states: dict[str, OwnerState], fair_clock: int | None = None) -> None:
    """Write the owners' rate logs and turns, and the queue's ``fair_clock`` when it moves (not None)."""
    ordered = sorted(states.items())
    if tx.store.is_postgres and ordered:
        await tx.fetch(_SAVE_OWNER_STATES, _owner_state_params(queue, states, fair_clock))
        return
    if ordered:
        stmt = tx.store.dialect.insert(owners_table)
        stmt = stmt.on_conflict_do_update(
            index_elements=["queue", "owner"],
            set_={"rate_starts": stmt.excluded.rate_starts, "turn": stmt.excluded.turn},
        )
        await tx.execute(stmt, [{"queue": queue, "owner": o, "rate_starts": st.rate_starts, "turn": st.turn} for o, st in ordered])
    if fair_clock is not None:
        await tx.execute(queues.update().where(queues.c.name == queue).values(fair_clock=fair_clock))


async def owned_queues(conn: Executor) -> list[str]:
    return list((await conn.execute(select(queues.c.name).where(queues.c.owner_by.is_not(None)).order_by(queues.c.name))).scalars())


async def owner_counts(conn: Executor, now: int, queue: str, limit: int) -> list[tuple[str, int, int]]:
    """The busiest owners of ``queue``: (owner, ready, processing), most ready + processing first."""
    ready = func.sum(case((and_(items.c.state == constant("queued"), items.c.next_processing <= now), 1), else_=0))
    processing = func.sum(case((items.c.state == constant("processing"), 1), else_=0))
    query = (
        select(items.c.owner, ready, processing)
        .where(items.c.queue == queue, items.c.state.in_(ACTIVE))
        .group_by(items.c.owner)
        .order_by((ready + processing).desc(), items.c.owner)
        .limit(limit)
    )
    return [(str(o), int(r or 0), int(p or 0)) for o, r, p in (await conn.execute(query)).all()]


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
_TAKE_IDS_SAVING_OWNERS = text("WITH " + _SAVED_OWNERS_CTES.rstrip() + ", " + str(_TAKE_IDS_WITH_EVENTS).removeprefix("WITH ")).columns(
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
            params.update(_owner_state_params(queue, owners, fair_clock))
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
    rows = sorted((_item(r) for r in (await tx.execute(taking)).all()), key=lambda r: order[r.id]) if ids else []
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
    rows = [_item(r[width:]) for r in result if r.id is not None]
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


LATENCY_SAMPLE = 100
"""Items per bucket the dashboard's latency chart averages (the latest finished of each queue,
shared among the queues): a larger sample makes the planner's cost cross ``jit_above_cost``, and compiling
the plan then costs more (~100 ms) than running it (~10 ms at 1M items finished in the hour)."""

_SAMPLED_LATENCY_PG = text(
    "SELECT b.i, avg(s.d) FROM generate_series(0, :buckets) AS b(i) "
    "CROSS JOIN unnest(CAST(:queues AS text[])) AS q(queue) CROSS JOIN LATERAL ("
    " SELECT i.finished_at - i.created_at AS d FROM interactions i WHERE i.queue = q.queue AND i.finished_at IS NOT NULL"
    " AND i.finished_at >= CAST(:since AS bigint) + b.i * CAST(:bucket AS bigint)"
    " AND i.finished_at < CAST(:since AS bigint) + (b.i + 1) * CAST(:bucket AS bigint)"
    " ORDER BY i.finished_at DESC LIMIT :sample) AS s GROUP BY b.i"
)


async def mean_latency_by_bucket(conn: Executor, since: int, until: int, bucket_ms: int, *, postgres: bool = False) -> dict[int, float]:
    """Mean time from created to finished (ms) of the items that finished in each ``bucket_ms`` after ``since``.
    Of a sample: the last finished of each queue in each bucket, ``LATENCY_SAMPLE`` in all (one range of the
    finished index each), so the chart costs the same at 10 or 10,000 items finished a second."""
    named = list((await conn.execute(select(counts.c.queue).group_by(counts.c.queue).having(func.sum(counts.c.n) > 0))).scalars())
    if not named:
        return {}
    # Buckets as ``core.data.mean_duration_by_bucket`` numbers them: ``until`` itself falls in the one past the end.
    buckets, sample = (until - since) // bucket_ms, max(2, LATENCY_SAMPLE // len(named))
    if postgres:
        params = {"buckets": buckets, "queues": named, "since": since, "bucket": bucket_ms, "sample": sample}
        return {int(i): float(mean or 0) for i, mean in (await conn.execute(_SAMPLED_LATENCY_PG, params)).all()}
    # SQLite has no LATERAL; a statement per queue and bucket costs microseconds there (no network between).
    found: dict[int, list[float]] = {}
    for queue in named:
        for i in range(buckets + 1):
            start = since + i * bucket_ms
            params = {"b_queue": queue, "b_start": start, "b_end": start + bucket_ms, "b_sample": sample}
            mean, n = (await conn.execute(_SAMPLED_LATENCY_BUCKET, params)).one()
            if n:
                found.setdefault(i, []).extend([float(mean)] * int(n))
    return {i: sum(values) / len(values) for i, values in found.items()}


_LATEST_FINISHED = (
    select((items.c.finished_at - items.c.created_at).label("d"))
    .where(items.c.queue == bindparam("b_queue"), items.c.finished_at.is_not(None),
           items.c.finished_at >= bindparam("b_start"), items.c.finished_at < bindparam("b_end"))
    .order_by(items.c.finished_at.desc()).limit(bindparam("b_sample")).subquery()
)
_SAMPLED_LATENCY_BUCKET = select(func.avg(_LATEST_FINISHED.c.d), func.count())


# --- retention ------------------------------------------------------------------------------------------


async def delete_finished_before(tx: Executor, queue: str, before: int, batch: int) -> int:
    # Oldest first on ix_interactions_finished: without an order the plan was a Seq Scan that stops after
    # ``batch`` matches only while the old rows sit first in the table (the soak), not once vacuum reuses pages.
    ids = (select(items.c.id).where(items.c.queue == queue, items.c.finished_at.is_not(None), items.c.finished_at < before)
           .order_by(items.c.finished_at).limit(batch))
    return (await tx.execute(items.delete().where(items.c.id.in_(ids.scalar_subquery())))).rowcount or 0


# --- schedules (periodic work) --------------------------------------------------------------------------

SCHEDULE_FIELDS = ("cron", "timezone", "queue", "data", "catch_up_ms", "next_tick", "source")


async def put_schedule(tx: Transaction, row: ScheduleRow) -> None:
    """Create or replace a schedule (its ``created_at`` stays)."""
    values = {k: getattr(row, k) for k in SCHEDULE_FIELDS}
    stmt = tx.store.dialect.insert(schedules).values(name=row.name, created_at=row.created_at, updated_at=row.updated_at, **values)
    await tx.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={**values, "updated_at": row.updated_at}))


_SCHEDULE = select(schedules).where(schedules.c.name == bindparam("name"))


async def get_schedule(conn: Executor, name: str) -> ScheduleRow | None:
    row = (await conn.execute(_SCHEDULE, {"name": name})).first()
    return None if row is None else ScheduleRow(*row)


async def list_schedules(conn: Executor) -> list[ScheduleRow]:
    return [ScheduleRow(*r) for r in (await conn.execute(select(schedules).order_by(schedules.c.name))).all()]


async def delete_schedule(tx: Executor, name: str) -> bool:
    return bool((await tx.execute(schedules.delete().where(schedules.c.name == name))).rowcount)


async def take_due_schedules(tx: Transaction, now: int) -> list[ScheduleRow]:
    """Schedules with a tick due, locked (SKIP LOCKED: each is fired by one server at a time)."""
    query = select(schedules).where(schedules.c.next_tick <= now).order_by(schedules.c.next_tick)
    return [ScheduleRow(*r) for r in (await tx.execute(tx.store.dialect.skip_locked(query))).all()]


async def set_next_tick(tx: Executor, name: str, next_tick: int) -> None:
    await tx.execute(schedules.update().where(schedules.c.name == name).values(next_tick=next_tick))


async def earliest_tick(conn: Executor) -> int | None:
    value = (await conn.execute(select(func.min(schedules.c.next_tick)))).scalar()
    return None if value is None else int(value)


__all__ = ["FINISHED", "InteractionRow", "NewInteraction", "QueueRow", "Store"]
