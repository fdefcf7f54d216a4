"""Domain functions of the interactions face: create, read, finish, schedule, queue settings, retention.

Leasing, heartbeats and releases are in ``leasing``; both share the helpers here. Every change writes its
event in the same transaction and wakes the queue's waiters (NOTIFY on PostgreSQL) when ``next_processing``
is set or changed.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import and_, case, func, or_, select, text

from mainspring.core import outbox
from mainspring.core.errors import InvalidRequest
from mainspring.core.paging import decode_cursor, encode_cursor
from mainspring.interactions.errors import InteractionFinished, InteractionNotFound, ParentNotFound
from mainspring.interactions.settings import InteractionsSettings
from mainspring.interactions.tables import interaction_queues as queues
from mainspring.interactions.tables import interactions as items
from mainspring.store import Store, Transaction, format_time

ACTIVE = ("queued", "processing")
FINISHED = ("completed", "failed", "cancelled")
STATUSES = ("scheduled", "ready", "processing", "waiting", "completed", "failed", "cancelled")
KIND = "interaction"

# Queues whose row this process has seen: rows are never deleted, so a cached yes stays true.
_known_queues: weakref.WeakKeyDictionary[Store, set[str]] = weakref.WeakKeyDictionary()


def queue_channel(queue: str) -> str:
    """Wakes lease waiters: something in ``queue`` became due, or a slot was freed."""
    return f"interactions:{queue}"


def finished_channel(queue: str) -> str:
    """Wakes readers waiting for an item of ``queue`` to finish, and workers whose item was cancelled."""
    return f"interactions-finished:{queue}"


def parse_id(value: str | int | None) -> int | None:
    """An interaction id from the API; ids are decimal strings, anything else names no interaction."""
    if value is None:
        return None
    text = str(value)
    if not text.isdigit() or len(text) > 18:
        return None
    return int(text)


# Rows written together share their times: formatting each distinct time once is a measured win.
fmt = functools.lru_cache(maxsize=8192)(format_time)


def status_of(row: Any, now: int) -> str:
    if row.state != "queued":
        return str(row.state)
    if row.next_processing is None:
        return "waiting"
    return "scheduled" if row.next_processing > now else "ready"


def to_api(row: Any, now: int, *, with_lease: bool = False) -> dict[str, Any]:
    lease = None
    if with_lease and row.state == "processing":
        lease = {"token": row.lease_token, "expires_at": fmt(row.lease_expires_at)}
    return {
        "id": str(row.id),
        "queue": row.queue,
        "parent_id": None if row.parent_id is None else str(row.parent_id),
        "name": row.name,
        "message_id": row.message_id,
        "channel": row.channel,
        "user": row.user,
        "source": row.source,
        "data": row.data,
        "result": row.result,
        "error": row.error,
        "status": status_of(row, now),
        "next_processing": fmt(row.next_processing),
        "attempts": row.attempts,
        "created_at": fmt(row.created_at),
        "updated_at": fmt(row.updated_at),
        "lease": lease,
    }


def event_data(row: Any, now: int, **extra: Any) -> dict[str, Any]:
    return {"queue": row.queue, "status": status_of(row, now), "next_processing": fmt(row.next_processing), **extra}


# --- queues ----------------------------------------------------------------------------------------


def queue_defaults(cfg: InteractionsSettings) -> dict[str, Any]:
    return {
        "rate_limit_count": None,
        "rate_limit_per_ms": None,
        "concurrency": None,
        "lease_ms": cfg.lease_ms,
        "error_delay_ms": cfg.error_delay_ms,
        "max_attempts": cfg.max_attempts,
        "processing_timeout_ms": cfg.processing_timeout_ms,
        "retention_ms": cfg.retention_ms,
    }


async def ensure_queue(tx: Transaction, cfg: InteractionsSettings, queue: str) -> None:
    known = _known_queues.setdefault(tx.store, set())
    if queue in known:
        return
    now = tx.store.now_ms()
    stmt = tx.store.dialect.insert(queues).values(name=queue, created_at=now, updated_at=now, **queue_defaults(cfg))
    await tx.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
    known.add(queue)


def queue_to_api(row: Any) -> dict[str, Any]:
    rate = None
    if row.rate_limit_count is not None:
        rate = {"count": row.rate_limit_count, "per_ms": row.rate_limit_per_ms}
    return {
        "name": row.name,
        "rate_limit": rate,
        "concurrency": row.concurrency,
        "lease_ms": row.lease_ms,
        "error_delay_ms": row.error_delay_ms,
        "max_attempts": row.max_attempts,
        "processing_timeout_ms": row.processing_timeout_ms,
        "retention_ms": row.retention_ms,
    }


async def put_queue(store: Store, cfg: InteractionsSettings, queue: str, values: dict[str, Any]) -> dict[str, Any]:
    """Replace a queue's settings; every server applies them at its next lease."""
    rate = values.get("rate_limit")
    row_values = queue_defaults(cfg)
    for key in ("concurrency", "lease_ms", "error_delay_ms", "max_attempts", "processing_timeout_ms", "retention_ms"):
        if values.get(key) is not None:
            row_values[key] = values[key]
    row_values["rate_limit_count"] = rate["count"] if rate else None
    row_values["rate_limit_per_ms"] = rate["per_ms"] if rate else None
    async with store.transaction() as tx:
        now = store.now_ms()
        stmt = store.dialect.insert(queues).values(name=queue, created_at=now, updated_at=now, **row_values)
        await tx.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={**row_values, "updated_at": now}))
        # A looser limit may let waiting workers lease at once.
        tx.notify(queue_channel(queue))
    _known_queues.setdefault(store, set()).add(queue)
    return await get_queue(store, cfg, queue)


async def get_queue(store: Store, cfg: InteractionsSettings, queue: str) -> dict[str, Any]:
    """A queue's settings and its items counted by status (a queue never configured has the defaults)."""
    now = store.now_ms()
    async with store.read() as conn:
        row = (await conn.execute(select(queues).where(queues.c.name == queue))).first()
        status = case(
            (items.c.state != "queued", items.c.state),
            (items.c.next_processing.is_(None), "waiting"),
            (items.c.next_processing > now, "scheduled"),
            else_="ready",
        )
        rows = (await conn.execute(select(status, func.count()).where(items.c.queue == queue).group_by(status))).all()
    body = queue_to_api(row) if row is not None else {"name": queue, **queue_to_api_defaults(cfg)}
    counts = dict.fromkeys(STATUSES, 0)
    counts.update({str(s): int(n) for s, n in rows})
    body["counts"] = counts
    return body


def queue_to_api_defaults(cfg: InteractionsSettings) -> dict[str, Any]:
    d = queue_defaults(cfg)
    return {
        "rate_limit": None,
        "concurrency": None,
        "lease_ms": d["lease_ms"],
        "error_delay_ms": d["error_delay_ms"],
        "max_attempts": d["max_attempts"],
        "processing_timeout_ms": d["processing_timeout_ms"],
        "retention_ms": d["retention_ms"],
    }


# --- create ----------------------------------------------------------------------------------------


async def create(store: Store, cfg: InteractionsSettings, queue: str, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create one interaction. Answers (interaction, created); created is False when ``message_id`` was
    already used in this queue, and the existing one is answered."""
    results = await create_many(store, cfg, queue, [spec])
    return results[0]


async def create_many(
    store: Store, cfg: InteractionsSettings, queue: str, specs: Sequence[dict[str, Any]]
) -> list[tuple[dict[str, Any], bool]]:
    """Create interactions in one transaction (all or none)."""
    async with store.transaction() as tx:
        await ensure_queue(tx, cfg, queue)
        now = store.now_ms()
        parents = await _parents(tx, [s["parent_id"] for s in specs if s.get("parent_id") is not None])
        rows_out: list[tuple[Any, bool]] = []
        plain: list[dict[str, Any]] = []
        for spec in specs:
            values = _new_values(queue, spec, now, parents)
            if spec.get("message_id") is None and not spec.get("completed"):
                plain.append(values)
                continue
            row, created = await _insert_one(tx, values)
            rows_out.append((row, created))
        if plain:
            rows_out.extend((row, True) for row in await _insert_plain(tx, plain))
        created_rows = [row for row, created in rows_out if created]
        await outbox.emit_many(
            tx, [outbox.Event("interaction.created", KIND, str(r.id), event_data(r, now)) for r in created_rows]
        )
        completed = [r for r in created_rows if r.state == "completed"]
        await outbox.emit_many(
            tx, [outbox.Event("interaction.completed", KIND, str(r.id), event_data(r, now, failed=False)) for r in completed]
        )
        await wake_parents(tx, [r.parent_id for r in completed if r.parent_id is not None], now)
        if any(r.state == "queued" for r in created_rows):
            tx.notify(queue_channel(queue))
    return _in_request_order(specs, rows_out, now)


_UNNEST_COLUMNS = (
    ("queue", "text"),
    ("parent_id", "bigint"),
    ("name", "text"),
    ("channel", "text"),
    ("user", "text"),
    ("source", "text"),
    ("data", "jsonb"),
    ("state", "text"),
    ("next_processing", "bigint"),
    ("created_at", "bigint"),
    ("updated_at", "bigint"),
)

_UNNEST_INSERT = text(
    "INSERT INTO interactions ("
    + ", ".join(f'"{c}"' for c, _ in _UNNEST_COLUMNS)
    + ", attempts) SELECT *, 0 FROM unnest("
    + ", ".join(f"CAST(:{c} AS {t}[])" for c, t in _UNNEST_COLUMNS)
    + ") RETURNING *"
)


async def _insert_plain(tx: Transaction, plain: list[dict[str, Any]]) -> list[Any]:
    """Insert rows that need no conflict handling, in request order."""
    if tx.store.is_postgres and len(plain) > 1:
        # Measured hot path: one INSERT … SELECT FROM unnest(arrays) instead of a multi-row VALUES
        # (bulk creates several times faster, and the statement text is the same for any batch size).
        params = {c: [row[c] for row in plain] for c, _ in _UNNEST_COLUMNS}
        params["data"] = [None if d is None else json.dumps(d) for d in params["data"]]
        rows = (await tx.execute(_UNNEST_INSERT, params)).all()
        # Ids come from the sequence in insertion order, which is the order of the arrays.
        return sorted(rows, key=lambda r: r.id)
    stmt = items.insert().returning(*items.c, sort_by_parameter_order=True)
    return list((await tx.execute(stmt, plain)).all())


def _in_request_order(specs: Sequence[dict[str, Any]], rows_out: list[tuple[Any, bool]], now: int) -> list[tuple[dict[str, Any], bool]]:
    keyed = [(r, c) for r, c in rows_out if r.message_id is not None or r.state == "completed"]
    plain = [(r, c) for r, c in rows_out if not (r.message_id is not None or r.state == "completed")]
    keyed_iter, plain_iter = iter(keyed), iter(plain)
    out = []
    for spec in specs:
        special = spec.get("message_id") is not None or spec.get("completed")
        row, created = next(keyed_iter) if special else next(plain_iter)
        out.append((to_api(row, now), created))
    return out


def _new_values(queue: str, spec: dict[str, Any], now: int, parents: dict[int, Any]) -> dict[str, Any]:
    parent_id = spec.get("parent_id")
    if parent_id is not None:
        parent = parents.get(parent_id)
        if parent is None:
            raise ParentNotFound(f"no interaction {parent_id}")
    completed = bool(spec.get("completed"))
    due = spec.get("due_at")
    return {
        "queue": queue,
        "parent_id": parent_id,
        "name": spec.get("name"),
        "message_id": spec.get("message_id"),
        "channel": spec.get("channel"),
        "user": spec.get("user"),
        "source": spec.get("source"),
        "data": spec.get("data"),
        "result": spec.get("result") if completed else None,
        "state": "completed" if completed else "queued",
        "next_processing": None if completed else (now if due is None else due),
        "attempts": 0,
        "created_at": now,
        "updated_at": now,
        "finished_at": now if completed else None,
    }


async def _parents(tx: Transaction, ids: list[int | None]) -> dict[int, Any]:
    wanted = {i for i in ids if i is not None}
    if not wanted:
        return {}
    rows = (await tx.execute(select(items.c.id, items.c.state).where(items.c.id.in_(wanted)))).all()
    return {r.id: r for r in rows}


async def _insert_one(tx: Transaction, values: dict[str, Any]) -> tuple[Any, bool]:
    if values["message_id"] is None:
        return (await tx.execute(items.insert().values(**values).returning(*items.c))).one(), True
    # The unique (queue, message_id) constraint decides between racing creators, on any server.
    stmt = tx.store.dialect.insert(items).values(**values)
    stmt = stmt.on_conflict_do_nothing(index_elements=["queue", "message_id"]).returning(*items.c)
    row = (await tx.execute(stmt)).first()
    if row is not None:
        return row, True
    existing = (
        await tx.execute(select(items).where(items.c.queue == values["queue"], items.c.message_id == values["message_id"]))
    ).one()
    return existing, False


# --- parents and children --------------------------------------------------------------------------


async def wake_parents(tx: Transaction, parent_ids: Iterable[int], now: int) -> None:
    """A child finished: its parent is due now. A parent being processed is marked, so the outcome its
    handler returns (wait, repeat) does not lose the wake-up."""
    ids = sorted(set(parent_ids))
    if not ids:
        return
    rows = (await tx.execute(tx.store.dialect.for_update(select(items).where(items.c.id.in_(ids), items.c.state.in_(ACTIVE))))).all()
    queued = [r.id for r in rows if r.state == "queued" and (r.next_processing is None or r.next_processing > now)]
    processing = [r.id for r in rows if r.state == "processing"]
    if queued:
        await tx.execute(items.update().where(items.c.id.in_(queued)).values(next_processing=now, updated_at=now))
    if processing:
        await tx.execute(items.update().where(items.c.id.in_(processing)).values(wake=True, updated_at=now))
    woken = [r for r in rows if r.id in set(queued)]
    await outbox.emit_many(
        tx, [outbox.Event("interaction.changed", KIND, str(r.id), {"queue": r.queue, "status": "ready", "next_processing": format_time(now)}) for r in woken]
    )
    for queue in {r.queue for r in woken}:
        tx.notify(queue_channel(queue))


async def cancel_children(tx: Transaction, parent_ids: Iterable[int], now: int) -> None:
    """A finished parent cancels its unfinished children, and theirs, down the tree."""
    frontier = sorted(set(parent_ids))
    while frontier:
        rows = (
            await tx.execute(
                tx.store.dialect.for_update(select(items).where(items.c.parent_id.in_(frontier), items.c.state.in_(ACTIVE)))
            )
        ).all()
        if not rows:
            return
        ids = [r.id for r in rows]
        await tx.execute(
            items.update()
            .where(items.c.id.in_(ids))
            .values(state="cancelled", next_processing=None, lease_token=None, lease_expires_at=None, finished_at=now, updated_at=now)
        )
        await outbox.emit_many(
            tx, [outbox.Event("interaction.cancelled", KIND, str(r.id), {"queue": r.queue, "status": "cancelled", "by_parent": True}) for r in rows]
        )
        for queue in {r.queue for r in rows}:
            tx.notify(finished_channel(queue))
            if any(r.state == "processing" for r in rows if r.queue == queue):
                tx.notify(queue_channel(queue))
        frontier = ids


async def finish(tx: Transaction, row: Any, state: str, now: int, *, result: Any = None, error: str | None = None) -> None:
    """Move ``row`` to a final state, with its event, parent wake-up and children cancellation."""
    values: dict[str, Any] = {
        "state": state,
        "next_processing": None,
        "lease_token": None,
        "lease_expires_at": None,
        "finished_at": now,
        "updated_at": now,
    }
    if state == "completed":
        values["result"] = result
    if error is not None:
        values["error"] = error
    await tx.execute(items.update().where(items.c.id == row.id).values(**values))
    if state == "cancelled":
        await outbox.emit(tx, "interaction.cancelled", KIND, str(row.id), {"queue": row.queue, "status": "cancelled"})
    else:
        data = {"queue": row.queue, "status": state, "failed": state == "failed"}
        if error is not None:
            data["error"] = error
        await outbox.emit(tx, "interaction.completed", KIND, str(row.id), data)
        if row.parent_id is not None:
            await wake_parents(tx, [row.parent_id], now)
    await cancel_children(tx, [row.id], now)
    tx.notify(finished_channel(row.queue))
    if row.state == "processing":
        tx.notify(queue_channel(row.queue))


async def _locked_active(tx: Transaction, interaction_id: str) -> Any:
    row = await locked(tx, interaction_id)
    if row.state in FINISHED:
        raise InteractionFinished(f"interaction {row.id} is {row.state}", status_now=row.state)
    return row


async def locked(tx: Transaction, interaction_id: str | int) -> Any:
    key = parse_id(interaction_id)
    row = None
    if key is not None:
        row = (await tx.execute(tx.store.dialect.for_update(select(items).where(items.c.id == key)))).first()
    if row is None:
        raise InteractionNotFound(f"no interaction {interaction_id}")
    return row


async def complete(store: Store, interaction_id: str, result: Any) -> dict[str, Any]:
    async with store.transaction() as tx:
        row = await _locked_active(tx, interaction_id)
        await finish(tx, row, "completed", store.now_ms(), result=result)
    return await read(store, interaction_id)


async def fail(store: Store, interaction_id: str, error: str) -> dict[str, Any]:
    async with store.transaction() as tx:
        row = await _locked_active(tx, interaction_id)
        await finish(tx, row, "failed", store.now_ms(), error=error)
    return await read(store, interaction_id)


async def cancel(store: Store, interaction_id: str) -> dict[str, Any]:
    async with store.transaction() as tx:
        row = await _locked_active(tx, interaction_id)
        await finish(tx, row, "cancelled", store.now_ms())
    return await read(store, interaction_id)


async def schedule(store: Store, interaction_id: str, due_at: int) -> dict[str, Any]:
    """Postpone (or advance) the next processing. An item being processed keeps its lease; the outcome
    its worker releases with decides what follows."""
    async with store.transaction() as tx:
        row = await _locked_active(tx, interaction_id)
        now = store.now_ms()
        await tx.execute(items.update().where(items.c.id == row.id).values(next_processing=due_at, updated_at=now))
        status = "processing" if row.state == "processing" else ("scheduled" if due_at > now else "ready")
        await outbox.emit(tx, "interaction.changed", KIND, str(row.id), {"queue": row.queue, "status": status, "next_processing": format_time(due_at)})
        tx.notify(queue_channel(row.queue))
    return await read(store, interaction_id)


# --- reads -----------------------------------------------------------------------------------------


async def read(store: Store, interaction_id: str | int) -> dict[str, Any]:
    key = parse_id(interaction_id)
    row = None
    if key is not None:
        async with store.read() as conn:
            row = (await conn.execute(select(items).where(items.c.id == key))).first()
    if row is None:
        raise InteractionNotFound(f"no interaction {interaction_id}")
    return to_api(row, store.now_ms())


async def wait_finished(store: Store, interaction_id: str, wait_ms: int) -> dict[str, Any]:
    """The interaction once it is finished, or as it is after ``wait_ms``."""
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        item = await read(store, interaction_id)
        left = deadline - time.monotonic()
        if item["status"] in FINISHED or left <= 0:
            return item
        waiter = store.notifier.waiter(finished_channel(item["queue"]))
        item = await read(store, interaction_id)
        if item["status"] in FINISHED:
            return item
        # Wake-ups are hints: look again at least every second.
        await waiter.wait(min(left, 1.0))


def _cursor_ints(cursor: str, arity: int) -> list[int]:
    values = decode_cursor(cursor, arity)
    if not all(isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**62 for v in values):
        raise InvalidRequest("cursor is not one this server gave", errors=[{"loc": ["query", "cursor"], "msg": "invalid cursor"}])
    return values


def _status_filter(status: str, now: int) -> Any:
    if status == "waiting":
        return and_(items.c.state == "queued", items.c.next_processing.is_(None))
    if status == "scheduled":
        return and_(items.c.state == "queued", items.c.next_processing > now)
    if status == "ready":
        return and_(items.c.state == "queued", items.c.next_processing <= now)
    return items.c.state == status


async def list_items(store: Store, queue: str, filters: dict[str, Any], limit: int, cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """A queue's interactions, oldest first, filtered; keyset-paged by id."""
    now = store.now_ms()
    query = select(items).where(items.c.queue == queue)
    for key in ("message_id", "channel", "user", "source"):
        if filters.get(key) is not None:
            query = query.where(items.c[key] == filters[key])
    if filters.get("status"):
        query = query.where(or_(*(_status_filter(s, now) for s in filters["status"])))
    if cursor:
        (after,) = _cursor_ints(cursor, 1)
        query = query.where(items.c.id > after)
    query = query.order_by(items.c.id).limit(limit + 1)
    async with store.read() as conn:
        rows = (await conn.execute(query)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    return [to_api(r, now) for r in rows], (encode_cursor(rows[-1].id) if more else None)


async def children(store: Store, interaction_id: str, name: str | None, limit: int, cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """Children of an interaction (with ``name``), oldest first."""
    parent = await read(store, interaction_id)
    now = store.now_ms()
    query = select(items).where(items.c.parent_id == int(parent["id"]))
    if name is not None:
        query = query.where(items.c.name == name)
    if cursor:
        created, after = _cursor_ints(cursor, 2)
        query = query.where(or_(items.c.created_at > created, and_(items.c.created_at == created, items.c.id > after)))
    query = query.order_by(items.c.created_at, items.c.id).limit(limit + 1)
    async with store.read() as conn:
        rows = (await conn.execute(query)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    return [to_api(r, now) for r in rows], (encode_cursor(rows[-1].created_at, rows[-1].id) if more else None)


async def latest_child(store: Store, interaction_id: str, name: str | None) -> dict[str, Any]:
    """The most recently created child (with ``name``)."""
    parent = await read(store, interaction_id)
    query = select(items).where(items.c.parent_id == int(parent["id"]))
    if name is not None:
        query = query.where(items.c.name == name)
    async with store.read() as conn:
        row = (await conn.execute(query.order_by(items.c.created_at.desc(), items.c.id.desc()).limit(1))).first()
    if row is None:
        raise InteractionNotFound(f"interaction {interaction_id} has no child named {name!r}")
    return to_api(row, store.now_ms())


# --- retention -------------------------------------------------------------------------------------


async def prune_finished(store: Store, batch: int) -> int:
    """Delete finished items older than their queue's ``retention_ms``, at most ``batch`` per queue."""
    now = store.now_ms()
    async with store.read() as conn:
        kept = (await conn.execute(select(queues.c.name, queues.c.retention_ms).where(queues.c.retention_ms.is_not(None)))).all()
    deleted = 0
    for queue, retention_ms in kept:
        async with store.transaction() as tx:
            ids = (
                select(items.c.id)
                .where(items.c.queue == queue, items.c.finished_at.is_not(None), items.c.finished_at < now - retention_ms)
                .limit(batch)
            )
            result = await tx.execute(items.delete().where(items.c.id.in_(ids.scalar_subquery())))
            deleted += result.rowcount or 0
        await asyncio.sleep(0)
    return deleted
