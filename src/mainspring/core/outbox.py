"""The outbox: every state change writes its event in the same transaction.

Readers follow ``position``, which is dense and grows in commit order:
- SQLite has one writer, so the inserting transaction takes ``max(position) + 1`` itself.
- PostgreSQL commits concurrently, and an id taken from a sequence can become visible after a larger one,
  so a reader following ids could skip an event for good. There, events are inserted without a position
  and a sequencer (one at a time, under an advisory lock, on any server) numbers the committed ones.
  Per subject the order is the commit order, because the changes of one subject lock its row.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, or_, select, text

from mainspring.core.tables import events
from mainspring.store import Store, Transaction, format_time

EVENTS_CHANNEL = "events"
SEQUENCER_CHANNEL = "events-sequencer"
SEQUENCER_LOCK = "mainspring:events-sequencer"
SEQUENCER_BATCH = 5000


@dataclass(frozen=True)
class Event:
    type: str
    subject_kind: str
    subject_id: str
    data: dict[str, Any]


async def emit(tx: Transaction, type: str, subject_kind: str, subject_id: str, data: dict[str, Any] | None = None) -> None:
    """Write one event in ``tx``; it exists if and only if ``tx`` commits."""
    await emit_many(tx, [Event(type, subject_kind, subject_id, data or {})])


async def emit_many(tx: Transaction, batch: Sequence[Event]) -> None:
    if not batch:
        return
    now = tx.store.now_ms()
    rows = [
        {"type": e.type, "at": now, "subject_kind": e.subject_kind, "subject_id": e.subject_id, "data": e.data}
        for e in batch
    ]
    if tx.store.is_postgres:
        await tx.execute(events.insert(), rows)
        tx.notify(SEQUENCER_CHANNEL)
    else:
        start = (await tx.execute(select(func.coalesce(func.max(events.c.position), 0)))).scalar_one()
        for offset, row in enumerate(rows, start=1):
            row["position"] = start + offset
        await tx.execute(events.insert(), rows)
        tx.notify(EVENTS_CHANNEL)


async def assign_positions(store: Store) -> int:
    """Number committed, unnumbered events (PostgreSQL). Returns how many it numbered."""
    if not store.is_postgres:
        return 0
    async with store.transaction() as tx:
        if not await store.dialect.try_advisory_xact_lock(tx.conn, SEQUENCER_LOCK):
            return 0
        result = await tx.execute(
            text(
                """
                UPDATE events SET position = numbered.pos
                FROM (
                    SELECT id,
                           (SELECT COALESCE(MAX(position), 0) FROM events) + row_number() OVER (ORDER BY id) AS pos
                    FROM events WHERE position IS NULL ORDER BY id LIMIT :batch
                ) AS numbered
                WHERE events.id = numbered.id
                """
            ),
            {"batch": SEQUENCER_BATCH},
        )
        count = result.rowcount or 0
        if count:
            tx.notify(EVENTS_CHANNEL)
        return count


async def wait_numbered(store: Store, timeout_s: float = 10) -> None:
    """Return once every committed event has its position (PostgreSQL; at once on SQLite).

    ``assign_positions`` answers 0 when another server's sequencer holds the lock, so a caller that
    needs to read what it just committed (tests, a CLI) waits for the numbering here instead."""
    if not store.is_postgres:
        return
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        while await assign_positions(store):
            pass
        async with store.read() as conn:
            left = (await conn.execute(select(func.count()).select_from(events).where(events.c.position.is_(None)))).scalar_one()
        if not left or asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.01)


def event_to_api(row: Any) -> dict[str, Any]:
    return {
        "id": str(row.position),
        "type": row.type,
        "at": format_time(row.at),
        "subject": {"kind": row.subject_kind, "id": row.subject_id},
        "data": row.data,
    }


async def read_events(
    store: Store, after: int, limit: int, types: Iterable[str] | None = None
) -> tuple[list[dict[str, Any]], int]:
    """Events after position ``after``, oldest first, and the cursor to continue from."""
    query = select(events).where(events.c.position > after).order_by(events.c.position).limit(limit)
    wanted = [t for t in (types or []) if t]
    if not wanted:
        async with store.read() as conn:
            rows = (await conn.execute(query)).all()
        return [event_to_api(r) for r in rows], (rows[-1].position if rows else after)
    exact = [t for t in wanted if not t.endswith("*")]
    prefixes = [t[:-1] for t in wanted if t.endswith("*")]
    clauses = [events.c.type.in_(exact)] if exact else []
    clauses.extend(events.c.type.startswith(p, autoescape=True) for p in prefixes)
    async with store.read() as conn:
        # The top is read first and bounds the scan: under READ COMMITTED each statement has its own
        # snapshot, and an event numbered between the two reads must not be jumped over.
        top = (await conn.execute(select(func.coalesce(func.max(events.c.position), after)))).scalar_one()
        rows = (await conn.execute(query.where(or_(*clauses), events.c.position <= top))).all()
    if len(rows) == limit:
        return [event_to_api(r) for r in rows], rows[-1].position
    # Fewer than asked: everything up to the top was scanned, so the cursor may move past it.
    return [event_to_api(r) for r in rows], max(after, top)


async def delete_events_before(store: Store, before_ms: int, batch: int = 1000) -> int:
    """Retention: drop events older than ``before_ms`` in small batches."""
    async with store.transaction() as tx:
        # The newest event always stays: SQLite numbers the next one from it.
        newest = select(func.max(events.c.position)).scalar_subquery()
        ids = select(events.c.id).where(events.c.at < before_ms, events.c.position < newest).limit(batch)
        result = await tx.execute(events.delete().where(events.c.id.in_(ids.scalar_subquery())))
        return result.rowcount or 0


__all__ = [
    "EVENTS_CHANNEL",
    "Event",
    "assign_positions",
    "delete_events_before",
    "emit",
    "emit_many",
    "read_events",
]
