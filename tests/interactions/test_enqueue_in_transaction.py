"""Enqueue inside the caller's own transaction (API.md §6): with asyncpg, psycopg 3 and SQLAlchemy connections
through the producer, and from plain SQL with ``mainspring_enqueue``; committed → due at once and the waiting
worker woken by the commit; rolled back → no item, no event, no wake-up. SQLite and foreign connections refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from mainspring.core import outbox
from mainspring.core.errors import ForeignConnection, NeedsPostgres
from mainspring.interactions import leasing
from mainspring.interactions.settings import InteractionsSettings
from mainspring.producer import producer
from mainspring.store import Clock, Store
from tests.conftest import PG_ADMIN


def dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


@contextlib.asynccontextmanager
async def asyncpg_transaction(url: str, commit: bool) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(dsn(url))
    try:
        tx = conn.transaction()
        await tx.start()
        yield conn
        await (tx.commit() if commit else tx.rollback())
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def psycopg_transaction(url: str, commit: bool) -> AsyncIterator[Any]:
    async with await psycopg.AsyncConnection.connect(dsn(url)) as conn:
        yield conn
        await (conn.commit() if commit else conn.rollback())


@contextlib.asynccontextmanager
async def sqlalchemy_transaction(url: str, commit: bool) -> AsyncIterator[Any]:
    engine = create_async_engine(dsn(url).replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with engine.connect() as conn:
            await conn.begin()
            yield conn
            await (conn.commit() if commit else conn.rollback())
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def sqlalchemy_session(url: str, commit: bool) -> AsyncIterator[Any]:
    engine = create_async_engine(dsn(url).replace("postgresql://", "postgresql+psycopg://"))
    try:
        async with AsyncSession(engine) as session:
            yield session
            await (session.commit() if commit else session.rollback())
    finally:
        await engine.dispose()


DRIVERS: dict[str, Callable[[str, bool], contextlib.AbstractAsyncContextManager[Any]]] = {
    "asyncpg": asyncpg_transaction, "psycopg": psycopg_transaction,
    "sqlalchemy": sqlalchemy_transaction, "sqlalchemy-session": sqlalchemy_session,
}


@pytest.fixture
def pg_database_url(engine: str, database_url: str) -> str:
    if engine != "postgres":
        pytest.skip("writing in the caller's transaction is PostgreSQL's (SQLite: test_sqlite_refuses_a_connection)")
    return database_url


async def events_of(url: str, item_id: str) -> list[str]:
    store = Store(url)
    try:
        events, _ = await outbox.read_events(store, 0, 1000)
    finally:
        await store.close()
    return [e["type"] for e in events if e["subject"]["id"] == item_id]


async def count_items(url: str) -> int:
    conn = await asyncpg.connect(dsn(url))
    try:
        return int(await conn.fetchval("SELECT count(*) FROM interactions"))
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def waiting_worker(url: str, queue: str) -> AsyncIterator[asyncio.Task[leasing.Leased]]:
    """A worker in another store waiting for ``queue`` with a poll far beyond the test: only a wake-up takes it."""
    worker_side = Store(url, clock=Clock(), pool_size=2)
    await worker_side.start()
    await worker_side.listening()
    waiting = asyncio.create_task(leasing.lease_wait(worker_side, InteractionsSettings(), queue, "w", 5, None, 30_000, poll_ms=60_000))
    try:
        yield waiting
    finally:
        waiting.cancel()
        with contextlib.suppress(BaseException):
            await waiting
        await worker_side.close()


@pytest.mark.parametrize("driver", sorted(DRIVERS))
async def test_a_create_in_a_committed_transaction_is_due_at_once_and_wakes_a_worker(
    driver: str, pg_database_url: str, tmp_path: Path
) -> None:
    async with producer(database=pg_database_url, data_dir=tmp_path) as mainspring, waiting_worker(pg_database_url, "emails") as waiting:
        async with DRIVERS[driver](pg_database_url, True) as conn:
            item = await mainspring.create("emails", {"to": "ada"}, connection=conn, message_id="order-17")
            await asyncio.sleep(0.2)
            assert not waiting.done(), "the worker was woken before the caller committed"
            assert await count_items(pg_database_url) == 0, "the item is visible before the caller committed"
        taken = await asyncio.wait_for(waiting, 5)
    assert [i["id"] for i in taken.items] == [item["id"]] and taken.items[0]["data"] == {"to": "ada"}
    assert await events_of(pg_database_url, item["id"]) == ["interaction.created", "interaction.changed"]


@pytest.mark.parametrize("driver", sorted(DRIVERS))
async def test_a_create_in_a_rolled_back_transaction_leaves_no_item_no_event_no_wake_up(
    driver: str, pg_database_url: str, tmp_path: Path
) -> None:
    async with producer(database=pg_database_url, data_dir=tmp_path) as mainspring, waiting_worker(pg_database_url, "emails") as waiting:
        async with DRIVERS[driver](pg_database_url, False) as conn:
            created = await mainspring.create_many("emails", [{"data": 1}, {"data": 2, "priority": 5}], connection=conn)
        await asyncio.sleep(0.3)
        assert not waiting.done(), "a rolled back create woke a worker"
    assert len(created) == 2
    assert await count_items(pg_database_url) == 0
    assert await events_of(pg_database_url, created[0]["id"]) == []


async def test_create_many_in_a_transaction_keeps_idempotency_keys_and_order(pg_database_url: str, tmp_path: Path) -> None:
    async with producer(database=pg_database_url, data_dir=tmp_path) as mainspring:
        first = await mainspring.create("emails", {"n": 0}, message_id="k0")
        async with asyncpg_transaction(pg_database_url, True) as conn:
            items = await mainspring.create_many(
                "emails", [{"data": {"n": 1}, "message_id": "k1"}, {"data": {"n": 9}, "message_id": "k0"}, {"data": {"n": 2}}], connection=conn)
    assert [i["data"] for i in items] == [{"n": 1}, {"n": 0}, {"n": 2}]
    assert items[1]["id"] == first["id"]
    assert await count_items(pg_database_url) == 3


async def test_a_refused_create_leaves_the_callers_transaction_usable(pg_database_url: str, tmp_path: Path) -> None:
    """A create that fails (an unknown parent) undoes only its own writes: the caller's go on and commit."""
    from mainspring.interactions.errors import ParentNotFound

    async with producer(database=pg_database_url, data_dir=tmp_path) as mainspring:
        async with asyncpg_transaction(pg_database_url, True) as conn:
            await conn.execute("CREATE TABLE orders (id int)")
            with pytest.raises(ParentNotFound):
                await mainspring.create("emails", 1, parent_id="424242", connection=conn)
            await conn.execute("INSERT INTO orders VALUES (1)")
    conn = await asyncpg.connect(dsn(pg_database_url))
    try:
        assert await conn.fetchval("SELECT count(*) FROM orders") == 1
        assert await conn.fetchval("SELECT count(*) FROM interaction_queues WHERE name = 'emails'") == 0
    finally:
        await conn.close()


async def test_the_callers_asyncpg_connection_keeps_its_own_json_decoding(pg_database_url: str, tmp_path: Path) -> None:
    async with producer(database=pg_database_url, data_dir=tmp_path) as mainspring, asyncpg_transaction(pg_database_url, True) as conn:
        await mainspring.create("emails", {"to": "ada"}, connection=conn)
        assert await conn.fetchval("SELECT data FROM interactions") == '{"to": "ada"}'


async def test_a_connection_to_another_database_is_refused(pg_database_url: str, tmp_path: Path) -> None:
    async with producer(database=pg_database_url, data_dir=tmp_path) as mainspring:
        other = await asyncpg.connect(PG_ADMIN)
        try:
            async with other.transaction():
                with pytest.raises(ForeignConnection) as refused:
                    await mainspring.create("emails", 1, connection=other)
        finally:
            await other.close()
        with pytest.raises(ForeignConnection):
            await mainspring.create("emails", 1, connection=object())
    assert refused.value.code == "foreign_connection"


async def test_sqlite_refuses_a_connection_and_creates_through_the_producers_own(engine: str, database_url: str, tmp_path: Path) -> None:
    if engine != "sqlite":
        pytest.skip("SQLite's refusal")
    async with producer(database=database_url, data_dir=tmp_path) as mainspring:
        with pytest.raises(NeedsPostgres) as refused:
            await mainspring.create("emails", 1, connection=object())
        items = await mainspring.create_many("emails", [{"data": 1}, {"data": 2}])
    assert refused.value.code == "connection_needs_postgresql"
    assert [i["data"] for i in items] == [1, 2]


async def test_the_sql_function_enqueues_in_the_callers_transaction(pg_database_url: str, tmp_path: Path) -> None:
    """Any language: ``SELECT mainspring_enqueue(queue, data, fields)``; committed → due at once, waking a
    worker; rolled back → nothing; bad fields refused with nothing written."""
    async with waiting_worker(pg_database_url, "emails") as waiting:
        conn = await asyncpg.connect(dsn(pg_database_url))
        try:
            async with conn.transaction():
                kept = await conn.fetchval("SELECT mainspring_enqueue('emails', $1::jsonb, $2::jsonb)",
                                           json.dumps({"to": "ada"}), json.dumps({"message_id": "m1", "user": "u1", "priority": 3}))
            again = await conn.fetchval("SELECT mainspring_enqueue('emails', '{}', '{\"message_id\": \"m1\"}')")
            tx = conn.transaction()
            await tx.start()
            dropped = await conn.fetchval("SELECT mainspring_enqueue('emails', '2')")
            await tx.rollback()
            for bad in ('{"colour": 1}', '{"priority": 5000}', '{"process_at": "2027-01-01T00:00:00Z", "process_in_ms": 1}',
                        '{"message_id": "no spaces"}', '{"parent_id": "77"}'):
                with pytest.raises(asyncpg.InvalidParameterValueError):
                    await conn.fetchval("SELECT mainspring_enqueue('emails', '1', $1::jsonb)", bad)
            with pytest.raises(asyncpg.InvalidParameterValueError):
                await conn.fetchval("SELECT mainspring_enqueue('bad queue', '1')")
        finally:
            await conn.close()
        taken = await asyncio.wait_for(waiting, 5)
    assert again == kept
    assert [(i["id"], i["data"], i["user"], i["priority"], i["message_id"]) for i in taken.items] == [(str(kept), {"to": "ada"}, "u1", 3, "m1")]
    assert await count_items(pg_database_url) == 1
    assert await events_of(pg_database_url, str(dropped)) == []
    assert await events_of(pg_database_url, str(kept)) == ["interaction.created", "interaction.changed"]


async def test_the_sql_function_writes_what_a_create_writes(pg_database_url: str, tmp_path: Path) -> None:
    """The same item as ``POST /v1/queues/{queue}/interactions`` (the producer's create) with the same fields,
    the same events; a child created completed wakes its parent."""
    from mainspring.interactions import service

    fields = {"name": "n", "channel": "c", "source": "s", "process_in_ms": 60_000}
    conn = await asyncpg.connect(dsn(pg_database_url))
    try:
        made = await conn.fetchval("SELECT mainspring_enqueue('emails', '{\"x\": 1}', $1::jsonb)", json.dumps(fields))
        scheduled = await conn.fetchval("SELECT next_processing - created_at FROM interactions WHERE id = $1", made)
        child = await conn.fetchval("SELECT mainspring_enqueue('emails', 'null', $1::jsonb)",
                                    json.dumps({"parent_id": str(made), "completed": True, "result": {"ok": 1}}))
    finally:
        await conn.close()
    async with producer(database=pg_database_url, data_dir=tmp_path) as mainspring:
        created = await mainspring.create("emails", {"x": 1}, **fields)
        by_sql = await service.read(mainspring.store, made)
        done = await service.read(mainspring.store, child)
    ignore = {"id", "created_at", "updated_at", "next_processing", "status"}
    assert {k: v for k, v in by_sql.items() if k not in ignore} == {k: v for k, v in created.items() if k not in ignore}
    assert scheduled == 60_000 and created["status"] == "scheduled"
    assert by_sql["status"] == "ready", "a child created completed makes its parent due now"
    assert (done["status"], done["result"], done["parent_id"]) == ("completed", {"ok": 1}, str(made))
    assert await events_of(pg_database_url, str(child)) == ["interaction.created", "interaction.completed"]
    assert await events_of(pg_database_url, str(made)) == ["interaction.created", "interaction.changed"]


async def test_an_open_callers_transaction_does_not_hold_up_other_writers_events(pg_database_url: str, tmp_path: Path) -> None:
    """Events are numbered under one lock held to the end of the transaction that takes it: the caller's
    transaction, which may stay open long after its create, takes it only when it commits."""
    async with producer(database=pg_database_url, data_dir=tmp_path) as mainspring:
        async with asyncpg_transaction(pg_database_url, True) as conn:
            mine = await mainspring.create("emails", 1, connection=conn)
            other = await asyncio.wait_for(mainspring.create("reports", 2), 5)
        assert await events_of(pg_database_url, other["id"]) == ["interaction.created"]
        assert await events_of(pg_database_url, mine["id"]) == ["interaction.created"]


async def test_concurrent_callers_each_write_in_their_own_transaction(pg_database_url: str, tmp_path: Path) -> None:
    async with producer(database=pg_database_url, data_dir=tmp_path) as mainspring:
        async def one(n: int, commit: bool) -> str:
            async with DRIVERS["asyncpg" if n % 2 else "psycopg"](pg_database_url, commit) as conn:
                item = await mainspring.create("emails", n, connection=conn, message_id=f"c-{n}")
                await asyncio.sleep(0.05)
                return str(item["id"])

        made = await asyncio.gather(*(one(n, n < 4) for n in range(8)))
    conn = await asyncpg.connect(dsn(pg_database_url))
    try:
        kept = sorted((r["message_id"], r["data"]) for r in await conn.fetch("SELECT message_id, data FROM interactions"))
    finally:
        await conn.close()
    assert kept == [(f"c-{n}", str(n)) for n in range(4)] and len(set(made)) == 8
