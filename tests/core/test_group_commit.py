"""Group commit: writes arriving together share a transaction, writes of one kind share one call, and a
failure among them is answered to its own writer alone."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from sqlalchemy import func, select, text

from mainspring.core import outbox
from mainspring.core.tables import events
from mainspring.store import Store, Transaction

OVERLAP_S = 0.5
"""How long the open groups stay open: time enough for one group more to start, were it let."""


class Refused(Exception):
    pass


async def event_subjects(store: Store) -> list[str]:
    async with store.read() as conn:
        return sorted((await conn.execute(select(events.c.subject_id))).scalars())


async def test_writes_of_one_kind_arriving_together_are_written_in_one_call(store: Store) -> None:
    calls: list[list[int]] = []

    async def write_all(tx: Transaction, items: list[int]) -> list[int]:
        calls.append(items)
        await outbox.emit_many(tx, [outbox.Event("test.n", "test", str(n), {}) for n in items])
        return [n * 10 for n in items]

    answers = await asyncio.gather(*(store.grouped_batch("kind", write_all, n) for n in range(6)))
    assert answers == [0, 10, 20, 30, 40, 50]
    assert sorted(n for call in calls for n in call) == list(range(6))
    assert len(calls) < 6, calls  # the first commits at once, the rest arrive while it does
    assert await event_subjects(store) == [str(n) for n in range(6)]


async def test_a_refused_write_among_a_batch_is_answered_alone_and_the_others_commit(store: Store) -> None:
    async def write_all(tx: Transaction, items: list[int]) -> list[int]:
        if 3 in items:
            raise Refused("three")
        await outbox.emit_many(tx, [outbox.Event("test.n", "test", str(n), {}) for n in items])
        return items

    answers = await asyncio.gather(*(store.grouped_batch("kind", write_all, n) for n in range(6)), return_exceptions=True)
    assert [a if not isinstance(a, Refused) else "refused" for a in answers] == [0, 1, 2, "refused", 4, 5]
    assert await event_subjects(store) == ["0", "1", "2", "4", "5"]


async def test_plain_writes_and_batches_of_two_kinds_share_one_group(store: Store) -> None:
    seen: dict[str, list[list[str]]] = {"a": [], "b": []}

    def writer(kind: str):  # type: ignore[no-untyped-def]
        async def write_all(tx: Transaction, items: list[str]) -> list[str]:
            seen[kind].append(items)
            await outbox.emit_many(tx, [outbox.Event("test.n", "test", item, {}) for item in items])
            return [kind + item for item in items]
        return write_all

    async def plain(tx: Transaction) -> str:
        await outbox.emit(tx, "test.n", "test", "plain")
        return "plain"

    answers = await asyncio.gather(
        store.grouped(plain),
        *(store.grouped_batch("a", writer("a"), str(n)) for n in range(3)),
        *(store.grouped_batch("b", writer("b"), str(n)) for n in range(3, 5)),
    )
    assert answers == ["plain", "a0", "a1", "a2", "b3", "b4"]
    assert seen["a"] and seen["b"]
    assert all(len(call) > 0 for calls in seen.values() for call in calls)
    async with store.read() as conn:
        assert (await conn.execute(select(func.count()).select_from(events))).scalar_one() == 6


@pytest.mark.parametrize("size", [1, 2])
async def test_a_batch_answers_each_writer_its_own_result(store: Store, size: int) -> None:
    async def write_all(tx: Transaction, items: list[tuple[int, int]]) -> list[int]:
        return [a + b for a, b in items]

    pairs = [(n, n * size) for n in range(8)]
    answers = await asyncio.gather(*(store.grouped_batch("sum", write_all, pair) for pair in pairs))
    assert answers == [a + b for a, b in pairs]


async def test_a_create_committed_alone_wakes_other_servers(store: Store, database_url: str, settings) -> None:  # type: ignore[no-untyped-def]
    from mainspring.interactions import service

    other = Store(database_url, pool_size=2, sqlite_synchronous="NORMAL")
    await other.start()
    try:
        await other.listening()
        await service.create(store, settings.interactions, "wq", {"data": {}})  # the queue row exists from now on
        channel = service.queue_channel("wq")
        while await other.notifier.waiter(channel).wait(0.3):
            pass  # wake-ups of the listener's start and of the first create: let them pass
        # Workers' queue channel (on PostgreSQL a trigger sends it too) and, on PostgreSQL, the event
        # sequencer's, which only the create's own statement sends when it commits alone.
        waiters = [other.notifier.waiter(channel)]
        if store.is_postgres:
            waiters.append(other.notifier.waiter(outbox.SEQUENCER_CHANNEL))
        await service.create(store, settings.interactions, "wq", {"data": {"n": 1}})
        for waiter in waiters:
            assert await waiter.wait(5), "the other server was not woken"
    finally:
        await other.close()


async def test_reads_of_one_kind_arriving_together_are_read_in_one_call_and_an_error_answers_its_reader_alone(store: Store) -> None:
    calls: list[list[int]] = []

    async def read_all(conn: object, items: list[int]) -> list[object]:
        calls.append(items)
        count = (await conn.execute(select(func.count()).select_from(events))).scalar_one()  # type: ignore[attr-defined]
        return [Refused(str(n)) if n == 3 else (n, count) for n in items]

    answers = await asyncio.gather(*(store.read_batched("kind", read_all, n) for n in range(6)), return_exceptions=True)
    assert [a if not isinstance(a, Refused) else "refused" for a in answers] == [(0, 0), (1, 0), (2, 0), "refused", (4, 0), (5, 0)]
    assert sorted(n for call in calls for n in call) == list(range(6))
    assert len(calls) < 6, calls  # the first reads at once, the rest arrive while it does


async def test_no_more_groups_are_open_at_once_than_the_store_allows(store: Store) -> None:
    """At most ``parallel`` shared transactions at a time (one on SQLite, a few on PostgreSQL): a write arriving
    while that many are open waits for one of them to commit, however long they take."""
    parallel = store.group_commit.parallel
    log: list[str] = []
    one_more_started, opened = asyncio.Event(), asyncio.Event()

    async def held_open(tx: Transaction) -> None:
        log.append("open")
        opened.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(one_more_started.wait(), OVERLAP_S)
        log.append("committed")

    async def one_more(tx: Transaction) -> None:
        log.append("one more")
        one_more_started.set()

    writes = []
    for _ in range(parallel):
        # Each in a group of its own: the next arrives once the one before runs.
        opened.clear()
        writes.append(asyncio.create_task(store.grouped(held_open)))
        await asyncio.wait_for(opened.wait(), 30)
    writes.append(asyncio.create_task(store.grouped(one_more)))
    await asyncio.gather(*writes)
    assert log.index("one more") > log.index("committed"), log



async def test_a_batch_among_other_writes_never_commits_alone_so_a_failed_group_writes_it_once(store: Store) -> None:
    """A batch that is its transaction's only writer may commit its one statement at once (PostgreSQL's hot
    paths); beside another kind of write it may not, since a failure among them runs each write again alone."""
    async with store.transaction() as tx:
        await tx.execute(text("CREATE TABLE written (n integer)"))
    insert = text("INSERT INTO written (n) VALUES (1)")

    async def write_all(tx: Transaction, items: list[int]) -> list[int]:
        await (tx.execute_alone(insert) if tx.may_run_alone else tx.execute(insert))
        return items

    async def refused(tx: Transaction, items: list[int]) -> list[int]:
        raise Refused("no")

    answers = await asyncio.gather(store.grouped_batch("a", write_all, 1), store.grouped_batch("b", refused, 2), return_exceptions=True)
    assert answers[0] == 1 and isinstance(answers[1], Refused)
    async with store.read() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM written"))).scalar_one() == 1
