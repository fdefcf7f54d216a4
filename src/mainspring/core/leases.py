"""Leases: whoever works on something holds a token with an expiry; writes are fenced by the token."""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import ColumnElement, Table

from mainspring.core.errors import LeaseLost
from mainspring.store import Transaction


def new_token() -> str:
    return secrets.token_urlsafe(18)


def held(table: Table, token: str) -> ColumnElement[bool]:
    """The row is still leased with ``token``. A lease taken over gets a new token, so this is the fence."""
    return table.c.lease_token == token


async def fenced_update(tx: Transaction, table: Table, where: ColumnElement[bool], token: str, **values: Any) -> None:
    """Update the row only while ``token`` holds it; otherwise ``409 lease_lost`` and nothing changes."""
    result = await tx.execute(table.update().where(where, held(table, token)).values(**values))
    if not result.rowcount:
        raise LeaseLost()
