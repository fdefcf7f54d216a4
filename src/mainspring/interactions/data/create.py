"""Creating items: on PostgreSQL one statement inserts the items and their ``interaction.created`` events
together (a data-modifying CTE over ``unnest`` arrays, the same text for any number of items); on SQLite, which has
no round trips to save, one insert per item and one for the events."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, case, func, literal, select, text

from mainspring.core import data as core_data
from mainspring.core import outbox
from mainspring.core.outbox import SEQUENCER_CHANNEL
from mainspring.interactions.data.rows import InteractionRow, NewInteraction, item_row
from mainspring.interactions.tables import interaction_queues as queues
from mainspring.interactions.tables import interactions as items
from mainspring.store import Transaction, format_time
from mainspring.store.dialect import Executor
from mainspring.store.notify import PG_CHANNEL, payloads

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
# The arrays are unnested from a subquery that is not flattened (OFFSET 0): the planner then estimates the same
# rows whatever the arrays hold, so after its first five runs on a connection PostgreSQL keeps one generic plan
# of the statement instead of planning it again at every run (the arrays as constants give exact row counts,
# which made every custom plan look cheaper than the generic one: ~0.3 ms of PostgreSQL's CPU per create,
# bench/create_statement.py). The plan's shape does not depend on the count.
_CREATE_WITH_EVENTS = text(
    "WITH ins AS (INSERT INTO interactions ("
    + ", ".join(f'"{c}"' for c, _ in _UNNEST_COLUMNS)
    + ", owner, attempts) SELECT u.*, COALESCE((SELECT CASE q.owner_by WHEN 'user' THEN u.\"user\" WHEN 'source' THEN u.source "
    "WHEN 'channel' THEN u.channel END FROM interaction_queues AS q WHERE q.name = u.queue), ''), 0 FROM (SELECT "
    + ", ".join(f"CAST(:{c} AS {t}[]) AS a{i}" for i, (c, t) in enumerate(_UNNEST_COLUMNS))
    + " OFFSET 0) AS p CROSS JOIN LATERAL unnest(" + ", ".join(f"p.a{i}" for i in range(len(_UNNEST_COLUMNS)))
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
        rows = [item_row(r) for r in (await tx.fetch_alone(_CREATE_WITH_EVENTS_ALONE, params)).all()]
    else:
        statement = _CREATE_WITH_EVENTS_AT_COMMIT if tx.events_at_commit else _CREATE_WITH_EVENTS
        rows = [item_row(r) for r in (await tx.execute(statement, params)).all()]
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
        return item_row((await tx.execute(_INSERT_ONE, values)).one())
    # The unique (queue, message_id) constraint decides between racing creators, on any server.
    stmt = _INSERT_KEYED.get(tx.store.dialect.name)
    if stmt is None:
        stmt = _INSERT_KEYED[tx.store.dialect.name] = (
            tx.store.dialect.insert(items).values(owner=_OWNER_OF_NEW)
            .on_conflict_do_nothing(index_elements=["queue", "message_id"]).returning(*items.c)
        )
    row = (await tx.execute(stmt, values)).first()
    return None if row is None else item_row(row)


def _owned_values(new: NewInteraction, now: int) -> dict[str, Any]:
    """The values of ``new`` and what ``_OWNER_OF_NEW`` reads its owner from."""
    return {**_values(new, now), "o_user": new.user, "o_source": new.source, "o_channel": new.channel, "o_queue": new.queue}


async def insert_one(tx: Transaction, new: NewInteraction, now: int) -> InteractionRow | None:
    """Insert one interaction (any kind, completed too) without events; None when its message_id was used."""
    return await _insert_one(tx, _owned_values(new, now))


async def by_message_id(conn: Executor, queue: str, message_id: str) -> InteractionRow | None:
    row = (await conn.execute(_BY_MESSAGE_ID, {"queue": queue, "message_id": message_id})).first()
    return None if row is None else item_row(row)


async def existing_ids(conn: Transaction, ids: Iterable[int]) -> set[int]:
    wanted = sorted(set(ids))
    if not wanted:
        return set()
    return set((await conn.execute(select(items.c.id).where(conn.store.dialect.any_of(items.c.id, wanted)))).scalars())
