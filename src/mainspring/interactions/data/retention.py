"""What a store keeps: finished items deleted past a queue's retention, and the latency of what finished."""

from __future__ import annotations

from sqlalchemy import bindparam, func, select, text

from mainspring.interactions.tables import interaction_counts as counts
from mainspring.interactions.tables import interaction_queues as queues
from mainspring.interactions.tables import interactions as items
from mainspring.store import Store
from mainspring.store.dialect import Executor


async def queues_with_retention(conn: Executor) -> list[tuple[str, int]]:
    rows = (await conn.execute(select(queues.c.name, queues.c.retention_ms).where(queues.c.retention_ms.is_not(None)))).all()
    return [(r.name, int(r.retention_ms)) for r in rows]


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


async def mean_latency_by_bucket(conn: Executor, store: Store, since: int, until: int, bucket_ms: int) -> dict[int, float]:
    """Mean time from created to finished (ms) of the items that finished in each ``bucket_ms`` after ``since``.
    Of a sample: the last finished of each queue in each bucket, ``LATENCY_SAMPLE`` in all (one range of the
    finished index each), so the chart costs the same at 10 or 10,000 items finished a second."""
    named = list((await conn.execute(select(counts.c.queue).group_by(counts.c.queue).having(func.sum(counts.c.n) > 0))).scalars())
    if not named:
        return {}
    # Buckets as ``core.data.mean_duration_by_bucket`` numbers them: ``until`` itself falls in the one past the end.
    buckets, sample = (until - since) // bucket_ms, max(2, LATENCY_SAMPLE // len(named))
    if store.is_postgres:
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


async def delete_finished_before(tx: Executor, queue: str, before: int, batch: int) -> int:
    # Oldest first on ix_interactions_finished: without an order the plan was a Seq Scan that stops after
    # ``batch`` matches only while the old rows sit first in the table (the soak), not once vacuum reuses pages.
    ids = (select(items.c.id).where(items.c.queue == queue, items.c.finished_at.is_not(None), items.c.finished_at < before)
           .order_by(items.c.finished_at).limit(batch))
    return (await tx.execute(items.delete().where(items.c.id.in_(ids.scalar_subquery())))).rowcount or 0
