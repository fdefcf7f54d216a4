"""Reading items: one, by message id, a parent's children, filtered lists, and the locks a change takes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, or_, select

from mainspring.interactions.data.rows import ACTIVE, InteractionRow, item_row
from mainspring.interactions.tables import interactions as items
from mainspring.store import Transaction
from mainspring.store.dialect import Executor
from mainspring.store.schema import constant

_BY_ID = select(items).where(items.c.id == bindparam("id"))


async def get(conn: Executor, item_id: int) -> InteractionRow | None:
    row = (await conn.execute(_BY_ID, {"id": item_id})).first()
    return None if row is None else item_row(row)


async def lock(tx: Transaction, item_id: int) -> InteractionRow | None:
    """The item, its row locked until commit."""
    row = (await tx.execute(tx.store.dialect.for_update(_BY_ID), {"id": item_id})).first()
    return None if row is None else item_row(row)


async def lock_many(tx: Transaction, ids: Iterable[int]) -> dict[int, InteractionRow]:
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = (await tx.execute(tx.store.dialect.for_update(select(items).where(tx.store.dialect.any_of(items.c.id, wanted))))).all()
    return {r.id: item_row(r) for r in rows}


async def queues_of(conn: Executor, ids: Iterable[int]) -> dict[int, str]:
    """The queue of each item in ``ids`` that exists."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = (await conn.execute(select(items.c.id, items.c.queue).where(items.c.id.in_(wanted)))).all()
    return {r.id: r.queue for r in rows}


async def held_leases(conn: Executor, ids: Iterable[int]) -> dict[int, tuple[str, str | None]]:
    """(state, lease token) of each item in ``ids``."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = (await conn.execute(select(items.c.id, items.c.state, items.c.lease_token).where(items.c.id.in_(wanted)))).all()
    return {r.id: (r.state, r.lease_token) for r in rows}


async def lock_active(tx: Transaction, ids: Iterable[int]) -> list[InteractionRow]:
    wanted = sorted(set(ids))
    if not wanted:
        return []
    query = select(items).where(tx.store.dialect.any_of(items.c.id, wanted), items.c.state.in_(ACTIVE))
    return [item_row(r) for r in (await tx.execute(tx.store.dialect.for_update(query))).all()]


async def lock_active_children(tx: Transaction, parent_ids: Sequence[int]) -> list[InteractionRow]:
    query = select(items).where(tx.store.dialect.any_of(items.c.parent_id, parent_ids), items.c.state.in_(ACTIVE))
    return [item_row(r) for r in (await tx.execute(tx.store.dialect.for_update(query))).all()]


async def children(
    conn: Executor, parent_id: int, name: str | None, limit: int, after: tuple[int, int] | None
) -> list[InteractionRow]:
    """Children oldest first; ``after`` is the (created_at, id) keyset position to continue after."""
    query = select(items).where(items.c.parent_id == parent_id)
    if name is not None:
        query = query.where(items.c.name == name)
    if after is not None:
        created, last = after
        query = query.where(or_(items.c.created_at > created, and_(items.c.created_at == created, items.c.id > last)))
    query = query.order_by(items.c.created_at, items.c.id).limit(limit)
    return [item_row(r) for r in (await conn.execute(query)).all()]


async def latest_child(conn: Executor, parent_id: int, name: str | None) -> InteractionRow | None:
    query = select(items).where(items.c.parent_id == parent_id)
    if name is not None:
        query = query.where(items.c.name == name)
    row = (await conn.execute(query.order_by(items.c.created_at.desc(), items.c.id.desc()).limit(1))).first()
    return None if row is None else item_row(row)


def status_filter(status: str, now: int) -> ColumnElement[bool]:
    if status == "waiting":
        return and_(items.c.state == constant("queued"), items.c.next_processing.is_(None))
    if status == "scheduled":
        return and_(items.c.state == constant("queued"), items.c.next_processing > now)
    if status == "ready":
        return and_(items.c.state == constant("queued"), items.c.next_processing <= now)
    return items.c.state == status


async def list_items(
    conn: Executor, now: int, *, queue: str | None, filters: dict[str, Any], statuses: Sequence[str], limit: int,
    after_id: int | None, newest_first: bool = False,
) -> list[InteractionRow]:
    """Items filtered by exact field values and statuses, keyset-paged by id."""
    query = select(items)
    if queue is not None:
        query = query.where(items.c.queue == queue)
    for key, value in filters.items():
        if value is not None:
            query = query.where(items.c[key] == value)
    if statuses:
        query = query.where(or_(*(status_filter(s, now) for s in statuses)))
    if after_id is not None:
        query = query.where(items.c.id < after_id if newest_first else items.c.id > after_id)
    query = query.order_by(items.c.id.desc() if newest_first else items.c.id).limit(limit)
    return [item_row(r) for r in (await conn.execute(query)).all()]


async def ancestors(conn: Executor, parent_id: int | None, depth: int) -> list[InteractionRow]:
    """The chain of parents from ``parent_id`` up, nearest first (at most ``depth``)."""
    found: list[InteractionRow] = []
    while parent_id is not None and len(found) < depth:
        row = await get(conn, parent_id)
        if row is None:
            break
        found.append(row)
        parent_id = row.parent_id
    return found
