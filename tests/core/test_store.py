"""The store on both engines: migrations, transactions, concurrency, the clock."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from sqlalchemy import BigInteger, Text, column, func, select, text
from sqlalchemy.dialects.postgresql import JSONB

import mainspring
from mainspring.core import outbox
from mainspring.core.tables import events, publisher_cursors
from mainspring.store import ManualClock, Store, Transaction, format_time, parse_time
from mainspring.store.errors import STORE_ERRORS, StoreNewerThanServer, TransactionAborted
from mainspring.store.migrate import migrate, pending_revisions


async def test_migrations_twice_are_a_no_op(store: Store) -> None:
    await migrate(store)
    await migrate(store)
    assert await pending_revisions(store) == set()


async def test_two_servers_migrating_one_database_at_once(database_url: str, engine: str) -> None:
    if engine != "postgres":
        pytest.skip("SQLite serves one machine; concurrent migration is a PostgreSQL concern")
    from tests.conftest import _pg_admin, pg_url

    name = database_url.rsplit("/", 1)[1] + "_fresh"
    await _pg_admin(f'CREATE DATABASE "{name}"')
    stores = [Store(pg_url(name)) for _ in range(3)]
    try:
        await asyncio.gather(*(migrate(s) for s in stores))
        assert await pending_revisions(stores[0]) == set()
    finally:
        for s in stores:
            await s.close()
        await _pg_admin(f'DROP DATABASE "{name}" WITH (FORCE)')


async def test_a_store_a_newer_release_migrated_is_refused_clearly_before_any_write(store: Store) -> None:
    """During a rolling upgrade an older server left running must not write rows the newer schema no longer reads:
    a revision it does not know is refused by name, by migrate and by the worker's check alike."""
    async with store.transaction() as tx:
        await tx.execute(text("UPDATE alembic_version SET version_num = 'interactions_9999' WHERE version_num LIKE 'interactions_%'"))
    with pytest.raises(StoreNewerThanServer, match="interactions_9999") as refused:
        await migrate(store)
    assert refused.value.code == "store_newer_than_server" and refused.value.revisions == ["interactions_9999"]
    with pytest.raises(StoreNewerThanServer):
        await pending_revisions(store)


async def test_concurrent_writers_never_fail_with_database_locked(store: Store) -> None:
    async def write(i: int) -> None:
        async with store.transaction() as tx:
            await outbox.emit(tx, "test.write", "test", str(i))

    await asyncio.gather(*(write(i) for i in range(200)))
    async with store.read() as conn:
        assert (await conn.execute(select(func.count()).select_from(events))).scalar_one() == 200


async def test_a_failed_transaction_leaves_nothing(store: Store) -> None:
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await outbox.emit(tx, "test.write", "test", "1")
            raise RuntimeError("boom")
    async with store.read() as conn:
        assert (await conn.execute(select(func.count()).select_from(events))).scalar_one() == 0


async def write_then_fail_quietly(tx: Transaction, name: str) -> str:
    """Write a cursor row, then a statement that fails (the same primary key again) and whose error is caught: on
    PostgreSQL that aborts the whole transaction, whose COMMIT then answers ROLLBACK; on SQLite only the failed
    statement is undone."""
    await tx.execute(publisher_cursors.insert().values(name=name, position=1, updated_at=0))
    with contextlib.suppress(*STORE_ERRORS):
        await tx.execute(publisher_cursors.insert().values(name=name, position=2, updated_at=0))
    return name


async def write(tx: Transaction, name: str) -> str:
    await tx.execute(publisher_cursors.insert().values(name=name, position=1, updated_at=0))
    return name


async def stored_cursors(store: Store) -> set[str]:
    async with store.read() as conn:
        return set((await conn.execute(select(publisher_cursors.c.name))).scalars())


async def test_a_transaction_whose_failed_statement_was_caught_passes_for_committed_only_if_it_committed(store: Store, engine: str) -> None:
    try:
        async with store.transaction() as tx:
            await write_then_fail_quietly(tx, "quiet")
    except TransactionAborted:
        said_committed = False
    else:
        said_committed = True
    assert said_committed == ("quiet" in await stored_cursors(store))
    assert said_committed == (engine == "sqlite"), "PostgreSQL aborts the whole transaction"


async def test_a_write_whose_failed_statement_was_caught_never_passes_its_group_for_committed(store: Store, engine: str) -> None:
    """Group commit: the last write of a group catches a failed statement (so no later statement of the group fails
    loudly). The group is then run one write at a time: the others are answered once committed, and the quiet
    failure is never answered as committed."""
    works = [lambda tx: write(tx, "first"), lambda tx: write(tx, "second"), lambda tx: write_then_fail_quietly(tx, "quiet")]
    answers = await asyncio.gather(*(store.grouped(work) for work in works), return_exceptions=True)
    committed = await stored_cursors(store)
    assert answers[:2] == ["first", "second"] and {"first", "second"} <= committed
    if engine == "postgres":
        assert isinstance(answers[2], TransactionAborted) and "quiet" not in committed
    else:
        assert answers[2] == "quiet" and "quiet" in committed


def test_time_is_rfc3339_utc_with_milliseconds() -> None:
    assert format_time(1_800_000_000_123) == "2027-01-15T08:00:00.123Z"
    assert parse_time("2027-01-15T08:00:00.123Z") == 1_800_000_000_123
    assert parse_time("2027-01-15T10:00:00.123+02:00") == 1_800_000_000_123


def test_manual_clock_moves_only_when_told_and_wakes_subscribers() -> None:
    clock = ManualClock(1000)
    woken: list[int] = []
    clock.subscribe(lambda: woken.append(clock.now_ms()))
    assert clock.now_ms() == 1000
    clock.advance(500)
    assert clock.now_ms() == 1500
    assert woken == [1500]


_ROWS = text("SELECT n AS id, n * 2 AS twice, CAST(:label AS text) AS label, CAST(:doc AS jsonb) AS doc, n AS id "
             "FROM unnest(CAST(:ns AS bigint[])) AS n ORDER BY n").columns(
    column("id", BigInteger), column("twice", BigInteger), column("label", Text), column("doc", JSONB), column("id2", BigInteger))


async def test_fetch_alone_answers_the_rows_execute_alone_answers(store: Store) -> None:
    """The hot paths' statements run straight on asyncpg (PostgreSQL) read their rows as SQLAlchemy's:
    values, slices, attributes (a repeated name is its first column), ``all`` and ``scalar``; one round trip."""
    params = {"ns": [3, 1, 2], "label": "x", "doc": '{"a": [1, 2]}'}
    if not store.is_postgres:
        pytest.skip("SQLite runs execute_alone (no driver of its own to go to)")
    async with store.transaction(alone=True) as tx:
        expected = [tuple(r) for r in (await tx.execute_alone(_ROWS, params)).all()]
    before = store.backend.round_trips  # type: ignore[attr-defined]
    async with store.transaction(alone=True) as tx:
        result = await tx.fetch_alone(_ROWS, params)
    assert store.backend.round_trips == before + 1  # type: ignore[attr-defined]
    rows = result.all()
    assert [tuple(r) for r in rows] == expected == [(1, 2, "x", {"a": [1, 2]}, 1), (2, 4, "x", {"a": [1, 2]}, 2), (3, 6, "x", {"a": [1, 2]}, 3)]
    assert (rows[1].id, rows[1].twice, rows[1].doc, rows[1][1:3]) == (2, 4, {"a": [1, 2]}, (4, "x"))
    assert result.scalar() == 1
    with pytest.raises(AttributeError):
        _ = rows[0].missing
    async with store.transaction(alone=True) as tx:
        await tx.fetch_alone(_ROWS, params)
        with pytest.raises(RuntimeError):
            await tx.fetch_alone(_ROWS, params)  # the statement was the whole transaction


_PLAIN_ROWS = text("SELECT n AS id, n * 2 AS twice FROM fetched_numbers WHERE n >= :least ORDER BY n")


async def test_fetch_answers_the_rows_execute_answers_inside_the_transaction(store: Store) -> None:
    """A hot path's textual statement among others of a transaction (straight on asyncpg on PostgreSQL, through
    ``execute`` on SQLite) reads its rows as SQLAlchemy's, and sees the transaction's own writes."""
    async with store.transaction() as tx:
        await tx.execute(text("CREATE TABLE fetched_numbers (n bigint)"))
        await tx.execute(text("INSERT INTO fetched_numbers VALUES (3), (1), (2)"))
        expected = [tuple(r) for r in (await tx.execute(_PLAIN_ROWS, {"least": 2})).all()]
        rows = (await tx.fetch(_PLAIN_ROWS, {"least": 2})).all()
    assert [tuple(r) for r in rows] == expected == [(2, 4), (3, 6)]
    assert (rows[1].id, rows[1].twice) == (3, 6)


def test_only_the_store_and_the_data_modules_ask_which_engine_they_run_on() -> None:
    """The faces choose a path by what the engine can do (``store.dialect``'s capabilities, or a data module's
    question such as ``interactions.data.leases_alone``), never by its name: an engine's statements stay in one place."""
    package = Path(mainspring.__file__).parent
    asking = sorted(
        str(path.relative_to(package)) for path in package.rglob("*.py")
        if "is_postgres" in path.read_text()
        and path.parts[len(package.parts)] != "store" and path.stem != "data" and "data" not in path.parts[len(package.parts):-1]
    )
    assert asking == []


NUMBERING_LOCK_KEY = 1858941482
"""``lock_key(outbox.NUMBERING_LOCK)`` as migrated databases hold it."""


def test_a_lock_key_is_a_stable_signed_32_bit_number() -> None:
    """pg_advisory_* is given a signed 32-bit key, and a migration (core_0006) baked the events' numbering key
    into a column default: every key must fit, and the mapping may never change."""
    from mainspring.store.postgres import lock_key

    keys = [lock_key(f"key-{n}") for n in range(1000)]
    assert all(-(2**31) <= key < 2**31 for key in keys)
    assert min(keys) < 0 <= max(keys)
    assert lock_key(outbox.NUMBERING_LOCK) == NUMBERING_LOCK_KEY


async def test_advisory_locks_of_any_key_exclude_another_transaction(store: Store) -> None:
    """Whatever a key hashes to (half of them below 2**31), its lock is taken and held until the commit: another
    transaction's try answers False meanwhile (PostgreSQL; SQLite has one writer and needs none)."""
    keys = [f"key-{n}" for n in range(8)]
    async with store.transaction() as tx:
        for key in keys:
            await store.dialect.advisory_xact_lock(tx, key)
        async with store.read() as other:
            held = [await store.dialect.try_advisory_xact_lock(other, key) for key in keys]
    assert held == [not store.is_postgres] * len(keys)


async def test_a_connection_left_inside_a_transaction_is_never_given_back_to_the_pool(database_url: str, engine: str, clock: ManualClock) -> None:
    """A session that leaves a transaction open (a statement cut off, a ROLLBACK that never ran) is discarded:
    the next user of the pool must not run its statements inside what was left."""
    if engine != "postgres":
        pytest.skip("the pool of asyncpg connections is PostgreSQL's; SQLite's sessions are its own")
    store = Store(database_url, clock=clock, pool_size=1, sqlite_synchronous="NORMAL")
    await store.start()
    try:
        async with store.read() as session:
            await session.driver.execute("BEGIN")
            await session.driver.execute("SET LOCAL application_name = 'left-behind'")
        async with store.read() as session:
            assert not session.driver.is_in_transaction()
            assert await session.driver.fetchval("SHOW application_name") != "left-behind"
    finally:
        await store.close()


async def test_transactions_cancelled_at_any_point_give_every_connection_back(database_url: str, engine: str, clock: ManualClock) -> None:
    """A request cancelled (a client gone, a timeout) while its transaction checks out, runs or gives back its
    connection must still give it back: a pool of two that lost one would serve half as many, then none."""
    if engine != "postgres":
        pytest.skip("the pool of asyncpg connections is PostgreSQL's; SQLite's sessions are its own")
    store = Store(database_url, clock=clock, pool_size=1, sqlite_synchronous="NORMAL")
    await store.start()
    one = text("SELECT 1 AS one")

    async def lone() -> None:
        async with store.transaction(alone=True) as tx:
            await tx.fetch_alone(one, {})

    async def with_core() -> None:
        async with store.transaction() as tx:
            await tx.execute(one)
            await tx.fetch(one, {})

    try:
        for round_ in range(40):
            tasks = [asyncio.create_task(lone() if i % 2 else with_core()) for i in range(6)]
            # Cancelled after 0, 1, 2 … turns of the loop: before the checkout, in the statement, in the check-in.
            for _ in range(round_ % 8):
                await asyncio.sleep(0)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        pool = store.backend.engine.pool
        assert pool.checkedout() == 0, pool.status()
        async with asyncio.timeout(5):
            await asyncio.gather(*(lone() for _ in range(4)), with_core())
    finally:
        await store.close()
