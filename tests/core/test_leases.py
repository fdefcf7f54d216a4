"""The lease mechanics every face uses (core.leases): at its expiry a lease is no longer held and is free to be
taken over, never both held and free at one moment."""

from __future__ import annotations

import pytest

from mainspring.core import leases
from mainspring.core.errors import LeaseLost
from mainspring.core.tables import publisher_cursors
from mainspring.store import Store

CURSOR = publisher_cursors.c.name == "c"


async def test_a_lease_is_held_until_its_expiry_and_free_from_it_on(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.execute(publisher_cursors.insert().values(name="c", position=0, updated_at=0, lease_token="old", lease_expires_at=1_000))
    async with store.transaction() as tx:
        await leases.fenced_update(tx, publisher_cursors, CURSOR, "old", 999, updated_at=1)
        assert await leases.take(tx, publisher_cursors, CURSOR, "new", 999, 5_000) == 0
    with pytest.raises(LeaseLost):
        async with store.transaction() as tx:
            await leases.extend(tx, publisher_cursors, CURSOR, "old", 1_000, 2_000)
    async with store.transaction() as tx:
        assert await leases.take(tx, publisher_cursors, CURSOR, "new", 1_000, 5_000) == 1
    assert leases.is_held("old", 1_000, "old", 999) and not leases.is_held("old", 1_000, "old", 1_000)
