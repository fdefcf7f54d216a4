"""Owners of an owned queue: their dues, states (in-flight, rate windows, fair turns), pruning of idle ones."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, select, text

from mainspring.interactions.data.rows import ACTIVE, Starts
from mainspring.interactions.tables import interaction_owners as owners_table
from mainspring.interactions.tables import interaction_queues as queues
from mainspring.interactions.tables import interactions as items
from mainspring.store import Transaction
from mainspring.store.dialect import Executor
from mainspring.store.schema import constant

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


FILL_OWNER_DUES = text(
    "INSERT INTO interaction_owners (queue, owner, next_due) SELECT i.queue, i.owner, min(i.next_processing) "
    "FROM interactions AS i WHERE i.queue = :queue AND i.state = 'queued' AND i.next_processing IS NOT NULL "
    "GROUP BY i.queue, i.owner ORDER BY i.owner ON CONFLICT (queue, owner) DO UPDATE SET next_due = excluded.next_due "
    "WHERE interaction_owners.next_due IS NULL OR interaction_owners.next_due > excluded.next_due"
)


# One statement for all the owners a lease served (an executemany runs one upsert per owner on the server: up to
# ``room`` of them, the largest part of a fair lease's time), and the queue's fair clock with it (NULL: unchanged).
# In owner order, as every writer of these rows locks them.
SAVED_OWNERS_CTES = (
    "clock AS (UPDATE interaction_queues SET fair_clock = CAST(:clock AS bigint) WHERE name = :queue AND CAST(:clock AS bigint) IS NOT NULL), "
    "saved AS (INSERT INTO interaction_owners (queue, owner, rate_starts, turn) "
    "SELECT :queue, s.owner, CAST(s.rate_starts AS jsonb), s.turn FROM unnest(CAST(:owners AS text[]), "
    "CAST(:starts AS text[]), CAST(:turns AS bigint[])) AS s(owner, rate_starts, turn) "
    "ORDER BY s.owner ON CONFLICT (queue, owner) DO UPDATE SET rate_starts = excluded.rate_starts, turn = excluded.turn) "
)
_SAVE_OWNER_STATES = text("WITH " + SAVED_OWNERS_CTES + "SELECT 1")


def owner_state_params(queue: str, states: dict[str, OwnerState], fair_clock: int | None) -> dict[str, Any]:
    ordered = sorted(states.items())
    return {"queue": queue, "clock": fair_clock, "owners": [o for o, _ in ordered],
            "starts": [None if st.rate_starts is None else json.dumps(st.rate_starts) for _, st in ordered], "turns": [st.turn for _, st in ordered]}


async def save_owner_states(tx: Transaction, queue: str, states: dict[str, OwnerState], fair_clock: int | None = None) -> None:
    """Write the owners' rate logs and turns, and the queue's ``fair_clock`` when it moves (not None)."""
    ordered = sorted(states.items())
    if tx.store.is_postgres and ordered:
        await tx.fetch(_SAVE_OWNER_STATES, owner_state_params(queue, states, fair_clock))
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
