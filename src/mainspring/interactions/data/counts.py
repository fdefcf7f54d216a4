"""Counts by status: the kept counts per (queue, state), with ready and scheduled split at read time."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import ColumnElement, case, func, select, text

from mainspring.interactions.tables import interaction_counts as counts
from mainspring.interactions.tables import interactions as items
from mainspring.store import Store, Transaction
from mainspring.store import counts as kept_counts
from mainspring.store.dialect import Executor
from mainspring.store.schema import constant


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


async def count_by_status(conn: Executor, store: Store, now: int, *, queue: str | None = None) -> StatusCounts:
    """Items by queue and status: from the counts the triggers keep (exact), queued ones split into ready
    and scheduled by ``now``."""
    query = _STORED_COUNTS if queue is None else _STORED_COUNTS.where(counts.c.queue == queue)
    by_queue: dict[str, dict[str, int]] = {}
    for q, status, n in (await conn.execute(query)).all():
        by_queue.setdefault(str(q), {})[str(status)] = int(n)
    queued = {q: c.pop("queued") for q, c in by_queue.items() if "queued" in c}
    scheduled, estimated = await _scheduled(conn, now, queued, store.is_postgres)
    for q, n in queued.items():
        later = scheduled.get(q, 0)
        by_queue[q]["scheduled"] = later
        by_queue[q]["ready"] = n - later
    return StatusCounts(by_queue, frozenset((q, s) for q in estimated for s in ("ready", "scheduled")))


async def fold_counts(tx: Transaction) -> int:
    """PostgreSQL: fold the count rows of backends that are gone into slot 0 (``store.counts.fold``); SQLite keeps
    one row per count, nothing to fold."""
    if not tx.store.is_postgres:
        return 0
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
