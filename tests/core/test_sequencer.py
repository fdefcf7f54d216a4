"""The PostgreSQL event sequencer: one server leads and numbers each round in one statement; another takes
over when the leader's connection is gone, and positions stay dense and unique throughout."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, text

from mainspring.core import outbox
from mainspring.core.tables import events
from mainspring.store import Store


@pytest.fixture
def pg_store(store: Store) -> Store:
    if not store.is_postgres:
        pytest.skip("the sequencer numbers events on PostgreSQL; SQLite numbers them as it inserts them")
    return store


async def emit(store: Store, n: int) -> None:
    for i in range(n):
        async with store.transaction() as tx:
            await outbox.emit(tx, "test.n", "test", "s", {"n": i})


async def positions(store: Store) -> list[int | None]:
    async with store.read() as conn:
        return list((await conn.execute(select(events.c.position).order_by(events.c.id))).scalars())


async def test_a_leading_sequencer_numbers_a_round_in_one_round_trip(pg_store: Store) -> None:
    sequencer = outbox.Sequencer(pg_store)
    try:
        await emit(pg_store, 3)
        assert await sequencer.round() == 3  # takes the lead, then numbers
        await emit(pg_store, 2)
        before = pg_store.dialect.round_trips
        assert await sequencer.round() == 2
        assert pg_store.dialect.round_trips - before == 1
        assert await positions(pg_store) == [1, 2, 3, 4, 5]
    finally:
        await sequencer.close()


async def test_only_the_leader_numbers_and_transactions_under_the_lock_wait_their_turn(pg_store: Store) -> None:
    leader, other = outbox.Sequencer(pg_store), outbox.Sequencer(pg_store)
    try:
        await emit(pg_store, 2)
        assert await leader.round() == 2
        await emit(pg_store, 2)
        assert await other.round() == 0
        assert await outbox.assign_positions(pg_store) == 0
        assert await positions(pg_store) == [1, 2, None, None]
        assert await leader.round() == 2
    finally:
        await leader.close()
        await other.close()


async def test_another_sequencer_takes_over_when_the_leaders_connection_dies(pg_store: Store) -> None:
    leader, other = outbox.Sequencer(pg_store), outbox.Sequencer(pg_store)
    try:
        await emit(pg_store, 2)
        assert await leader.round() == 2
        async with pg_store.read() as conn:
            backend = (await conn.execute(text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ))).scalar_one()
            assert (await conn.execute(select(func.pg_terminate_backend(backend)))).scalar_one()
        await emit(pg_store, 3)
        with pytest.raises(Exception):  # noqa: B017 - whatever the driver raises for a terminated session
            await leader.round()
        assert await other.round() == 3
        assert await positions(pg_store) == [1, 2, 3, 4, 5]
        # The old leader comes back as a follower: the lock is taken.
        assert await leader.round() == 0
    finally:
        await leader.close()
        await other.close()


async def test_closing_the_leader_frees_the_lead(pg_store: Store) -> None:
    leader, other = outbox.Sequencer(pg_store), outbox.Sequencer(pg_store)
    try:
        await emit(pg_store, 1)
        assert await leader.round() == 1
        await leader.close()
        await emit(pg_store, 1)
        assert await other.round() == 1
        assert await positions(pg_store) == [1, 2]
    finally:
        await leader.close()
        await other.close()
