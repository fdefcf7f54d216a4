"""PostgreSQL numbers each event as it writes it (migration core_0006), in commit order: a reader following
positions never passes one that commits later, with no sequencer and no second write of the event row."""

from __future__ import annotations

import asyncio
import random

import pytest
from sqlalchemy import select, text

from mainspring.core import data, outbox
from mainspring.core.data import Event
from mainspring.core.tables import events
from mainspring.store import Store


@pytest.fixture
def pg_store(store: Store) -> Store:
    if not store.is_postgres:
        pytest.skip("SQLite has one writer: its insert takes max(position) + 1 (tests/core/test_events.py)")
    return store


async def positions(store: Store) -> list[int | None]:
    async with store.read() as conn:
        return list((await conn.execute(select(events.c.position).order_by(events.c.id))).scalars())


async def test_an_event_has_its_position_when_its_transaction_commits(pg_store: Store) -> None:
    async with pg_store.transaction() as tx:
        await outbox.emit(tx, "test.a", "test", "s")
        await outbox.emit_many(tx, [Event("test.b", "test", "s", {}), Event("test.c", "test", "s", {})])
    assert await positions(pg_store) == [1, 2, 3]
    items, cursor = await outbox.read_events(pg_store, 0, 10)
    assert [e["type"] for e in items] == ["test.a", "test.b", "test.c"] and cursor == 3


async def test_a_transactions_events_are_one_statement_written_last(pg_store: Store) -> None:
    async with pg_store.transaction() as tx:
        await outbox.emit(tx, "test.a", "test", "s")
        await outbox.emit(tx, "test.b", "test", "s")
        assert await positions(pg_store) == []  # nothing written yet, so no lock held yet
        before = tx.statements
    assert tx.statements == before + 1
    assert await positions(pg_store) == [1, 2]


async def test_a_transaction_with_events_waiting_to_be_written_cannot_run_one_statement_alone(pg_store: Store) -> None:
    """An autocommit statement would commit before the events written last: they would be lost."""
    async with pg_store.transaction(alone=True) as tx:
        assert tx.may_run_alone
        await outbox.emit(tx, "test.a", "test", "s")
        assert not tx.may_run_alone
        await tx.execute(select(1))
    assert await positions(pg_store) == [1]


async def test_an_insert_naming_no_position_is_numbered_too(pg_store: Store) -> None:
    """A face's own statement, a script's, or an older server's: the column's default numbers them all."""
    async with pg_store.transaction() as tx:
        await outbox.emit(tx, "test.a", "test", "s")
    async with pg_store.transaction() as tx:
        await tx.execute(text(
            "INSERT INTO events (type, at, subject_kind, subject_id, data) VALUES ('test.raw', 1, 'test', 's', '{}')"
        ))
    assert await positions(pg_store) == [1, 2]


async def test_a_rolled_back_number_leaves_a_gap_readers_step_over(pg_store: Store) -> None:
    class Injected(Exception):
        pass

    async with pg_store.transaction() as tx:
        await outbox.emit(tx, "test.a", "test", "s")
    with pytest.raises(Injected):
        async with pg_store.transaction() as tx:
            await data.insert_numbered_events(tx, [(Event("test.lost", "test", "s", {}), 1)])
            raise Injected
    async with pg_store.transaction() as tx:
        await outbox.emit(tx, "test.c", "test", "s")
    items, cursor = await outbox.read_events(pg_store, 0, 10)
    assert [(e["id"], e["type"]) for e in items] == [("1", "test.a"), ("3", "test.c")] and cursor == 3


async def test_a_transaction_holding_its_numbers_makes_later_numbering_wait_for_its_commit(pg_store: Store) -> None:
    """The lock taken with the first number is held to the end: a later writer numbers after the commit."""
    numbered = asyncio.Event()
    release = asyncio.Event()

    async def first() -> None:
        async with pg_store.transaction() as tx:
            await data.insert_numbered_events(tx, [(Event("test.first", "test", "s", {}), 1)])
            numbered.set()
            await release.wait()

    async def second() -> None:
        async with pg_store.transaction() as tx:
            await outbox.emit(tx, "test.second", "test", "s")

    holder = asyncio.create_task(first())
    await numbered.wait()
    waiter = asyncio.create_task(second())
    await asyncio.sleep(0.3)
    assert not waiter.done()  # waiting for the numbering lock
    assert await positions(pg_store) == []  # and nothing is visible yet
    release.set()
    await asyncio.wait_for(asyncio.gather(holder, waiter), 10)
    items, _ = await outbox.read_events(pg_store, 0, 10)
    assert [e["type"] for e in items] == ["test.first", "test.second"]


async def test_a_transaction_that_works_on_after_emitting_holds_no_lock_meanwhile(pg_store: Store) -> None:
    """Events are written as the last statement, so emitting early does not serialize other writers."""
    emitted = asyncio.Event()
    release = asyncio.Event()

    async def slow() -> None:
        async with pg_store.transaction() as tx:
            await outbox.emit(tx, "test.slow", "test", "s")
            await tx.execute(select(1))
            emitted.set()
            await release.wait()

    holder = asyncio.create_task(slow())
    await emitted.wait()
    async with asyncio.timeout(5):
        async with pg_store.transaction() as tx:
            await outbox.emit(tx, "test.quick", "test", "s")
    release.set()
    await asyncio.wait_for(holder, 10)
    items, _ = await outbox.read_events(pg_store, 0, 10)
    assert [e["type"] for e in items] == ["test.quick", "test.slow"]


async def test_concurrent_writers_and_a_reader_no_event_is_ever_skipped(pg_store: Store) -> None:
    """Writers number their events and then dawdle before committing, in random order; a reader following
    the cursor all along sees every committed event once, in position order."""
    rng = random.Random(23)
    writers, per_writer = 6, 20
    done = asyncio.Event()

    async def write(w: int) -> None:
        for i in range(per_writer):
            async with pg_store.transaction() as tx:
                await asyncio.sleep(rng.random() * 0.01)
                await data.insert_numbered_events(tx, [(Event("test.n", "test", f"w{w}", {"n": i}), 1)])
                await asyncio.sleep(rng.random() * 0.02)  # numbered, not yet committed

    seen: list[int] = []
    reads_while_writing = 0

    async def read() -> None:
        nonlocal reads_while_writing
        cursor = 0
        while True:
            finished = done.is_set()
            items, cursor = await outbox.read_events(pg_store, cursor, 7)
            seen.extend(int(e["id"]) for e in items)
            if finished and not items:
                return
            reads_while_writing += not finished and bool(items)
            await asyncio.sleep(0.001)

    reader = asyncio.create_task(read())
    await asyncio.gather(*(write(w) for w in range(writers)))
    done.set()
    await asyncio.wait_for(reader, 30)
    committed = [p for p in await positions(pg_store) if p is not None]
    assert len(committed) == writers * per_writer
    assert reads_while_writing > 10  # the reader did follow the writers
    assert seen == sorted(committed)  # each once, in order, none passed over
