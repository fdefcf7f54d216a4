"""Queues: their settings, pause, the locks a lease and a change take, and their rate windows."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import bindparam, func, select

from mainspring.interactions.data.owners import FILL_OWNER_DUES
from mainspring.interactions.data.rows import QueueRow, Starts, owner_expression, queue_row
from mainspring.interactions.tables import interaction_counts as counts
from mainspring.interactions.tables import interaction_queues as queues
from mainspring.interactions.tables import interactions as items
from mainspring.store import Transaction
from mainspring.store.dialect import Executor
from mainspring.store.schema import Millis, constant

RETRY_SETTINGS = ("backoff", "max_delay_ms", "jitter")
"""How a queue delays the retry of a failed attempt (``interactions.retry``)."""
OWNER_SETTINGS = ("priority_aging_ms", "owner_by", "per_owner_concurrency", "per_owner_rate_count", "per_owner_rate_per_ms", "fair", "weights")
"""Priorities that age, owners and their limits, fair shares (``leasing``)."""
QUEUE_SETTINGS = ("rate_limit_count", "rate_limit_per_ms", "concurrency", "lease_ms", "error_delay_ms", "max_attempts",
                  "processing_timeout_ms", "retention_ms", *RETRY_SETTINGS, *OWNER_SETTINGS)


_QUEUE = select(queues).where(queues.c.name == bindparam("name"))


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
            items.update().where(items.c.queue == name, items.c.state == constant("queued")).values(owner=owner_expression(owner_by))
        )
        if owner_by is not None:
            # Items whose owner did not change (a null field stays '') fired no trigger: every owner's due time again.
            await tx.execute(FILL_OWNER_DUES, {"queue": name})
    known: set[str] = tx.store.extras.setdefault("interactions:queues", set())
    tx.after_commit(lambda: known.add(name))


async def set_paused(tx: Transaction, name: str, paused: bool) -> bool:
    """Pause or resume a queue; False when it was so already."""
    statement = queues.update().where(queues.c.name == name, queues.c.paused == (not paused)).values(paused=paused, updated_at=tx.store.now_ms())
    return bool((await tx.execute(statement)).rowcount)


async def get_queue(conn: Executor, name: str) -> QueueRow | None:
    row = (await conn.execute(_QUEUE, {"name": name})).first()
    return None if row is None else queue_row(row)


async def lock_queue(tx: Transaction, name: str, *, shared: bool = False) -> QueueRow:
    """The queue's row, locked until commit: exclusively (leases that count limits, expiry, settings are
    serialized on every server), or ``shared`` (leases without limits run side by side, but not beside
    an exclusive holder)."""
    statement = tx.store.dialect.for_share(_QUEUE) if shared else tx.store.dialect.for_update(_QUEUE)
    return queue_row((await tx.execute(statement, {"name": name})).one())


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
    return queue_row(row[: len(queues.c)]), bool(row.has_expired)


async def queues_by_name(conn: Executor, names: Iterable[str]) -> dict[str, QueueRow]:
    rows = (await conn.execute(select(queues).where(queues.c.name.in_(sorted(set(names)))))).all()
    return {r.name: queue_row(r) for r in rows}


async def set_rate_starts(tx: Executor, name: str, starts: Starts) -> None:
    await tx.execute(queues.update().where(queues.c.name == name).values(rate_starts=starts))


async def queue_names(conn: Executor) -> list[str]:
    """Every queue that has a row or an item."""
    named = set((await conn.execute(select(queues.c.name))).scalars())
    # From the counts, not a scan of the items for their distinct queues.
    named |= set((await conn.execute(select(counts.c.queue).group_by(counts.c.queue).having(func.sum(counts.c.n) > 0))).scalars())
    return sorted(named)
