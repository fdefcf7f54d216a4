"""The outbox: every state change writes its event in the same transaction.

Readers follow ``position``, which grows in commit order:
- SQLite has one writer, so the inserting statement takes ``max(position) + 1`` itself.
- PostgreSQL commits concurrently, and an id taken from a sequence can become visible after a larger one,
  so a reader following ids could skip an event for good. There, events are inserted without a position
  and a sequencer (one at a time, under an advisory lock, on any server) numbers the committed ones.
  Per subject the order is the commit order, because the changes of one subject lock its row.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

from mainspring.core import data
from mainspring.core.data import Event, StoredEvent
from mainspring.store import Store, Transaction, format_time
from mainspring.store.notify import PG_CHANNEL

EVENTS_CHANNEL = "events"
SEQUENCER_CHANNEL = "events-sequencer"
SEQUENCER_LOCK = "mainspring:events-sequencer"
SEQUENCER_BATCH = 5000


async def emit(tx: Transaction, type: str, subject_kind: str, subject_id: str, data: dict[str, Any] | None = None) -> None:
    """Write one event in ``tx``; it exists if and only if ``tx`` commits."""
    await emit_many(tx, [Event(type, subject_kind, subject_id, data or {})])


async def emit_many(tx: Transaction, batch: Sequence[Event]) -> None:
    if not batch:
        return
    await data.insert_events(tx, tx.store, batch, tx.store.now_ms())
    tx.notify(SEQUENCER_CHANNEL if tx.store.is_postgres else EVENTS_CHANNEL)


async def assign_positions(store: Store) -> int:
    """Number committed, unnumbered events (PostgreSQL). Returns how many it numbered."""
    if not store.is_postgres:
        return 0
    async with store.transaction() as tx:
        if not await store.dialect.try_advisory_xact_lock(tx, SEQUENCER_LOCK):
            return 0
        count = await data.number_events(tx, SEQUENCER_BATCH)
        if count:
            tx.notify(EVENTS_CHANNEL)
        return count


class Sequencer:
    """Numbers committed events for one server (PostgreSQL), each round as cheap as the guarantees allow.

    The server that holds the sequencer's lock as a session lock, on a connection kept for it, numbers
    each round in one autocommit statement (number, then NOTIFY readers): the lock is held before the
    statement's snapshot is taken, so the snapshot sees every earlier round of every server. The other
    servers try the lock at their wake-ups and take over when its holder's connection is gone (PostgreSQL
    drops a session's locks with it, after the session's last statement has committed or rolled back).
    ``assign_positions`` (a transaction under the same lock, as a transaction lock) still works beside it.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._held: contextlib.AsyncExitStack | None = None
        self._session: Any = None

    async def round(self) -> int:
        """Number up to ``SEQUENCER_BATCH`` events if this server leads (taking the lead if it is free);
        answers how many were numbered."""
        if self._session is None and not await self._lead():
            return 0
        try:
            count = await data.number_events_and_notify(self._session, SEQUENCER_BATCH, PG_CHANNEL, EVENTS_CHANNEL)
        except BaseException as exc:
            held, self._held, self._session = self._held, None, None
            if held is not None:
                await held.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        if count:
            self.store.notifier.signal(EVENTS_CHANNEL)
        return count

    async def _lead(self) -> bool:
        stack = contextlib.AsyncExitStack()
        session = await stack.enter_async_context(self.store.dialect.session_lock(SEQUENCER_LOCK))
        if session is None:
            await stack.aclose()
            return False
        self._held, self._session = stack, session
        return True

    async def close(self) -> None:
        """Give up the lead (and its connection)."""
        held, self._held, self._session = self._held, None, None
        if held is not None:
            await held.aclose()


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
            left = await data.count_unnumbered(conn)
        if not left or asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.01)


async def head_position(store: Store) -> int:
    """The position of the latest numbered event (0 when there is none)."""
    async with store.read() as conn:
        return await data.head_position(conn)


async def count_by_bucket(store: Store, type_prefix: str, since: int, until: int, bucket_ms: int) -> dict[int, int]:
    """Events whose type starts with ``type_prefix``, counted per ``bucket_ms`` after ``since``."""
    async with store.read() as conn:
        return await data.events_by_bucket(conn, type_prefix, since, until, bucket_ms)


def event_to_api(event: StoredEvent) -> dict[str, Any]:
    return {
        "id": str(event.position),
        "type": event.type,
        "at": format_time(event.at),
        "subject": {"kind": event.subject_kind, "id": event.subject_id},
        "data": event.data,
    }


async def read_events(
    store: Store, after: int, limit: int, types: Iterable[str] | None = None
) -> tuple[list[dict[str, Any]], int]:
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
    already published."""
    async with store.transaction() as tx:
        up_to = await data.lowest_cursor(tx, publishers) if publishers else None
        return await data.delete_events_before(tx, before_ms, batch, up_to)


__all__ = [
    "EVENTS_CHANNEL",
    "Event",
    "Sequencer",
    "assign_positions",
    "delete_events_before",
    "emit",
    "emit_many",
    "read_events",
]
