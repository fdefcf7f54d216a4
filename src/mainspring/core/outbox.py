"""The outbox: every state change writes its event in the same transaction.

Readers follow ``position``, which grows in commit order:
- SQLite has one writer, so the inserting statement takes ``max(position) + 1`` itself.
- PostgreSQL commits concurrently, and a number taken from a sequence can become visible after a larger one,
  so a reader following numbers could skip an event for good. There, the position column's default
  (migration core_0006) takes one transaction-level advisory lock, then the sequence's next value: the lock
  is held until the transaction has committed and is visible, so whoever numbers next numbers above every
  earlier commit. Each event is written once, numbered. To hold that lock for the commit only, a
  transaction's events are written in its last statement (``Transaction.write_last``), all in one.
  Per subject the order is the commit order, because the changes of one subject lock its row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypedDict

from mainspring.core import data
from mainspring.core.data import Event, StoredEvent
from mainspring.core.tables import EVENT_COUNTS_KEPT_MS
from mainspring.store import Store, Transaction, format_time
from mainspring.types import JsonInput, JsonObject

EVENTS_CHANNEL = "events"
SEQUENCER_CHANNEL = EVENTS_CHANNEL
"""What the faces' one-statement writes notify when they wrote events: readers of the outbox. (Named for
the sequencer that numbered events before migration core_0006; the events are readable at commit now.)"""
NUMBERING_LOCK = "mainspring:events-numbering"
"""The advisory lock the position column's default takes before its number (migration core_0006)."""


async def emit(tx: Transaction, type: str, subject_kind: str, subject_id: str, data: Mapping[str, JsonInput] | None = None) -> None:
    """Write one event in ``tx``; it exists if and only if ``tx`` commits."""
    await emit_many(tx, [Event(type, subject_kind, subject_id, data or {})])


async def emit_many(tx: Transaction, batch: Sequence[Event]) -> None:
    if not batch:
        return
    if tx.store.dialect.events_numbered_last:
        # Written, numbered, as the transaction's last statement (with its other events).
        tx.write_last(EVENTS_CHANNEL, _write_events, (batch, tx.store.now_ms()))
    else:
        await data.insert_events(tx, tx.store, batch, tx.store.now_ms())
    tx.notify(EVENTS_CHANNEL)


async def _write_events(tx: Transaction, batches: list[tuple[Sequence[Event], int]]) -> None:
    events = [(event, at) for batch, at in batches for event in batch]
    if tx.events_at_commit:
        # The caller's transaction, which may stay open long: numbered by its commit (migration interactions_0017).
        await data.insert_events_at_commit(tx, events)
    else:
        await data.insert_numbered_events(tx, events)


async def assign_positions(store: Store) -> int:
    """Number committed events that have no position: there are none, since events are numbered as they are
    written; answers 0 (kept for callers written when a sequencer numbered them after commit)."""
    del store
    return 0


async def wait_numbered(store: Store, timeout_s: float = 10) -> None:
    """Return once every committed event has its position: at once, since events are numbered as they are
    written (kept for callers written when a sequencer numbered them after commit)."""
    del store, timeout_s


async def head_position(store: Store) -> int:
    """The position of the latest numbered event (0 when there is none)."""
    async with store.read() as conn:
        return await data.head_position(conn)


async def count_per_minute(store: Store, since_ms: int) -> dict[tuple[int, str], int]:
    """(minute's start, type) → events written in that minute, for the minutes from ``since_ms`` on."""
    async with store.read() as conn:
        return await data.events_per_minute(conn, since_ms)


class SubjectView(TypedDict):
    kind: str
    id: str


class EventView(TypedDict):
    """An event as the API (and every publisher) shows it."""

    id: str
    type: str
    at: str | None
    subject: SubjectView
    data: JsonObject


def event_to_api(event: StoredEvent) -> EventView:
    return {
        "id": str(event.position),
        "type": event.type,
        "at": format_time(event.at),
        "subject": {"kind": event.subject_kind, "id": event.subject_id},
        "data": event.data,
    }


async def read_events(
    store: Store, after: int, limit: int, types: Iterable[str] | None = None
) -> tuple[list[EventView], int]:
    """Events after position ``after``, oldest first, and the cursor to continue from."""
    wanted = [t for t in (types or []) if t]
    exact = [t for t in wanted if not t.endswith("*")]
    prefixes = [t[:-1] for t in wanted if t.endswith("*")]
    async with store.read() as conn:
        found, top = await data.events_after(conn, after, limit, exact, prefixes)
    cursor = found[-1].position if found else after
    if top is not None and len(found) < limit:
        # Fewer than asked: everything up to the top was scanned, so the cursor may move past it.
        cursor = max(after, top)
    return [event_to_api(e) for e in found], cursor


async def delete_events_before(store: Store, before_ms: int, batch: int = 1000, publishers: Sequence[str] = ()) -> int:
    """Retention: drop up to ``batch`` events older than ``before_ms`` that every one of ``publishers`` has
    already published. The per-minute counts go at that cutoff too, or sooner (``prune_event_counts``)."""
    async with store.transaction() as tx:
        up_to = await data.lowest_cursor(tx, publishers) if publishers else None
        await data.prune_events_per_minute(tx, max(before_ms, store.now_ms() - EVENT_COUNTS_KEPT_MS))
        return await data.delete_events_before(tx, before_ms, batch, up_to)


async def prune_event_counts(store: Store) -> int:
    """Forget the per-minute counts older than any reader needs (``EVENT_COUNTS_KEPT_MS``): they are pruned
    even when the events themselves are kept for ever (``server.events_retention_ms`` unset)."""
    async with store.transaction() as tx:
        return await data.prune_events_per_minute(tx, store.now_ms() - EVENT_COUNTS_KEPT_MS)


__all__ = [
    "EVENTS_CHANNEL",
    "Event",
    "assign_positions",
    "count_per_minute",
    "delete_events_before",
    "emit",
    "emit_many",
    "prune_event_counts",
    "read_events",
]
