"""What a release does to held items: their fences, their outcomes written (one statement per batch where it can),
lease extensions."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select, text

from mainspring.core import finishes, leases
from mainspring.core.outbox import SEQUENCER_CHANNEL
from mainspring.interactions.data.rows import InteractionRow, item_row
from mainspring.interactions.tables import interactions as items
from mainspring.store import Transaction
from mainspring.store.dialect import Executor
from mainspring.store.notify import PG_CHANNEL


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
    return item_row((await tx.execute(items.update().where(items.c.id == item_id).values(**values).returning(*items.c))).one())


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
# The rows are found by id from the fence, nothing else: the fence is the token, which only a processing item has
# (the check constraint of migration interactions_0018). Saying ``state = 'processing'`` as well let the planner
# read the batch through the partial index of processing items, whose entries for items completed in the last
# lease period still lie ahead of ``now``, and ``id = ANY(:ids)`` was then a filter searching the array for each
# of them: PostgreSQL spent 122–127 µs per item on a lease and its completion, 53–56 µs without them
# (bench/narrow_rows.py). The join on id is a nested loop over the primary key on a big table.
COMPLETE_HELD_CTES = (
    "fence AS (SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS text[]), CAST(:results AS text[])) "
    "AS f(id, token, result)), "
    "done AS (UPDATE interactions AS i SET state = 'completed', result = CAST(fence.result AS jsonb), next_processing = NULL, "
    "lease_token = NULL, lease_expires_at = NULL, finished_at = :now, updated_at = :now FROM fence "
    "WHERE i.id = fence.id AND i.lease_token = fence.token "
    "AND i.lease_expires_at > :now "
    "AND i.parent_id IS NULL AND (i.message_id IS NULL OR NOT (i.message_id LIKE ANY(CAST(:watched AS text[])))) "
    "AND NOT EXISTS (SELECT 1 FROM interactions AS c WHERE c.parent_id = i.id AND c.state IN ('queued', 'processing')) "
    "RETURNING i.id, i.queue), "
    "done_ev AS (INSERT INTO events (type, at, subject_kind, subject_id, data) "
    "SELECT 'interaction.completed', :now, 'interaction', done.id::text, "
    "jsonb_build_object('queue', done.queue, 'status', 'completed', 'failed', false) FROM done ORDER BY done.id), "
    "done_wake AS (SELECT pg_notify(:pg_channel, channel) FROM unnest(CAST(:channels AS text[])) AS channel "
    "WHERE EXISTS (SELECT 1 FROM done)) "
)
"""The completions' common table expressions: ``done`` answers the ids completed; ``done_wake`` must be read
by the statement (a CTE nobody reads is not run). ``data.lease`` puts them before its one-statement lease."""
DONE_WOKEN = "(SELECT count(*) FROM done_wake) >= 0"
_COMPLETE_HELD_ALONE = text("WITH " + COMPLETE_HELD_CTES + "SELECT done.id FROM done WHERE " + DONE_WOKEN)


def complete_held_params(held: Sequence[tuple[int, str, str]], now: int, channels: Sequence[str]) -> dict[str, Any]:
    """The parameters of ``COMPLETE_HELD_CTES``."""
    return {
        "ids": [i for i, _, _ in held], "tokens": [t for _, t, _ in held], "results": [r for _, _, r in held], "now": now,
        "pg_channel": PG_CHANNEL, "channels": [SEQUENCER_CHANNEL, *channels], "watched": finishes.like_patterns(),
    }


def notify_completed(tx: Transaction, done: set[int], channels: Sequence[str]) -> None:
    """This process's own wake-ups for completions a statement made (the statement sent the other servers')."""
    if done:
        tx.notify(SEQUENCER_CHANNEL)
        for channel in channels:
            tx.notify(channel)


async def complete_held_alone(tx: Transaction, held: Sequence[tuple[int, str, str]], now: int, channels: Sequence[str]) -> set[int]:
    """Complete each (id, token, result as JSON text) whose lease ``token`` still holds, if the item has no
    parent and no unfinished children, as the whole of ``tx`` (PostgreSQL, ``tx.may_run_alone``); answers the
    ids completed. ``channels`` are woken if any was."""
    done = {int(r.id) for r in (await tx.fetch_alone(_COMPLETE_HELD_ALONE, complete_held_params(held, now, channels))).all()}
    notify_completed(tx, done, channels)
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
