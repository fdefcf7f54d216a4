"""Leases, the one mechanism every face uses: whoever works on something holds a token with an expiry, both
in the row; a lease that expires is taken over with a new token; every write that finishes work is fenced by
the token, so a worker that lost its lease changes nothing (``409 lease_lost``).

One column shape everywhere (``lease_columns``): ``lease_token`` and ``lease_expires_at`` (epoch ms). The
conditions below are what the faces' data modules put in their statements; ``is_held`` is the same test on
a row already read under its lock.
"""

from __future__ import annotations

import secrets

from sqlalchemy import Column, ColumnElement, String, Table, Update, and_, or_

from mainspring.core.errors import LeaseLost
from mainspring.store.dialect import Executor
from mainspring.store.schema import Millis

TOKEN_LENGTH = 64


def lease_columns() -> list[Column[str] | Column[int]]:
    """The two columns a leased table carries."""
    return [Column("lease_token", String(TOKEN_LENGTH), nullable=True), Column("lease_expires_at", Millis, nullable=True)]


def new_token() -> str:
    return secrets.token_urlsafe(18)


def is_held(lease_token: str | None, lease_expires_at: int | None, token: str, now: int) -> bool:
    """A row read with these lease columns is still leased with ``token`` at ``now``."""
    return lease_token == token and lease_expires_at is not None and lease_expires_at > now


def held(table: Table, token: str, now: int | None = None) -> ColumnElement[bool]:
    """The row is leased with ``token`` (and, given ``now``, not expired). A lease taken over gets a new
    token, so this is the fence."""
    if now is None:
        return table.c.lease_token == token
    return and_(table.c.lease_token == token, table.c.lease_expires_at > now)


def free(table: Table, now: int | ColumnElement[int]) -> ColumnElement[bool]:
    """Nobody holds the row: never leased, released, or the lease expired."""
    return or_(table.c.lease_token.is_(None), table.c.lease_expires_at.is_(None), table.c.lease_expires_at <= now)


def released() -> dict[str, None]:
    """The values that end a lease."""
    return {"lease_token": None, "lease_expires_at": None}


def taking(table: Table, where: ColumnElement[bool], token: str | ColumnElement[str], now: int | ColumnElement[int],
           expires_at: int | ColumnElement[int], **values: object) -> Update:
    """The UPDATE that leases the free rows matching ``where`` with ``token`` until ``expires_at``: values, or
    bound parameters and expressions, so that a face can build it once and add ``RETURNING``."""
    return table.update().where(where, free(table, now)).values(lease_token=token, lease_expires_at=expires_at, **values)


async def take(tx: Executor, table: Table, where: ColumnElement[bool], token: str, now: int, expires_at: int, **values: object) -> int:
    """Lease the free rows matching ``where`` with ``token`` until ``expires_at``; answers how many it took."""
    return (await tx.execute(taking(table, where, token, now, expires_at, **values))).rowcount or 0


async def fenced_update(
    tx: Executor, table: Table, where: ColumnElement[bool], token: str, now: int | None = None, **values: object
) -> None:
    """Update the row only while ``token`` holds it; otherwise ``409 lease_lost`` and nothing changes."""
    result = await tx.execute(table.update().where(where, held(table, token, now)).values(**values))
    if not result.rowcount:
        raise LeaseLost()


async def extend(tx: Executor, table: Table, where: ColumnElement[bool], token: str, now: int, expires_at: int) -> None:
    """Move the expiry of a lease still held (``409 lease_lost`` otherwise)."""
    await fenced_update(tx, table, where, token, now, lease_expires_at=expires_at)
