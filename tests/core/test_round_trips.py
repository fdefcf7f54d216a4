"""The hot write paths stay short: the statements (on PostgreSQL, round trips) a request costs are counted,
so a change that adds one fails here rather than in a benchmark nobody ran."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from mainspring.config import Settings
from mainspring.store import Store
from tests.conftest import quiet_app_client

CREATES = 20


@pytest.fixture
async def quiet_client(settings: Settings, store: Store) -> AsyncIterator[httpx.AsyncClient]:
    """See ``tests.conftest.quiet_app_client``."""
    async with quiet_app_client(settings, store) as client:
        yield client


async def _per_request(store: Store, client: httpx.AsyncClient, method: str, path: str, bodies: list[Any]) -> float:
    assert (await client.request(method, path, json=bodies[0])).is_success  # warm: queue row, prepared statements
    before = store.backend.round_trips
    for body in bodies[1:]:
        answer = await client.request(method, path, json=body)
        assert answer.is_success, answer.text
    return (store.backend.round_trips - before) / (len(bodies) - 1)


async def test_an_interaction_create_is_three_round_trips_on_postgresql(store: Store, quiet_client: httpx.AsyncClient) -> None:
    per_create = await _per_request(store, quiet_client, "POST", "/v1/queues/q/interactions", [{"data": {"n": i}} for i in range(CREATES)])
    # PostgreSQL: BEGIN, one statement inserting the item and its event, NOTIFY + COMMIT.
    # SQLite: BEGIN IMMEDIATE, the item, its event, COMMIT — no round trips, but no more statements either.
    assert per_create <= (3 if store.is_postgres else 4), per_create


async def test_a_create_with_a_message_id_costs_no_more(store: Store, quiet_client: httpx.AsyncClient) -> None:
    bodies = [{"data": i, "message_id": f"m{i}"} for i in range(CREATES)]
    per_create = await _per_request(store, quiet_client, "POST", "/v1/queues/q/interactions", bodies)
    assert per_create <= (3 if store.is_postgres else 4), per_create


async def test_a_read_is_its_statement_alone(store: Store, quiet_client: httpx.AsyncClient) -> None:
    created = (await quiet_client.post("/v1/queues/q/interactions", json={})).json()
    await quiet_client.get(f"/v1/interactions/{created['id']}")
    before = store.backend.round_trips
    for _ in range(CREATES):
        assert (await quiet_client.get(f"/v1/interactions/{created['id']}")).status_code == 200
    per_read = (store.backend.round_trips - before) / CREATES
    # No BEGIN/ROLLBACK around a read on PostgreSQL; SQLite's snapshot is BEGIN, the read (its ROLLBACK is not
    # a statement SQLAlchemy runs).
    assert per_read <= (1 if store.is_postgres else 2), per_read


async def test_a_lease_of_an_unlimited_queue_is_one_round_trip_on_postgresql(store: Store, quiet_client: httpx.AsyncClient) -> None:
    for i in range(CREATES + 1):
        assert (await quiet_client.post("/v1/queues/q/interactions", json={"data": {"n": i}})).status_code == 201
    per_lease = await _per_request(store, quiet_client, "POST", "/v1/queues/q/lease", [{"worker": "w", "max": 1}] * (CREATES + 1))
    # PostgreSQL: one autocommit statement locking the queue's row, taking the item with its event, waking the
    # sequencer and reading what is due next (the queue's first lease here, which learns it is unlimited, is
    # the warm-up).
    assert per_lease <= (1 if store.is_postgres else 6), per_lease


async def test_a_create_alone_in_its_commit_is_one_round_trip_on_postgresql(store: Store, settings: Settings) -> None:
    from mainspring.interactions import service

    cfg = settings.interactions
    await service.create(store, cfg, "q", {"data": {}})  # warm: the queue row, prepared statements
    before = store.backend.round_trips
    for i in range(CREATES):
        await service.create(store, cfg, "q", {"data": {"n": i}})
    per_create = (store.backend.round_trips - before) / CREATES
    # PostgreSQL: the item, its event and its wake-ups in one autocommit statement.
    assert per_create <= (1 if store.is_postgres else 4), per_create


async def test_a_producer_create_and_a_producer_bulk_create_are_each_one_round_trip_on_postgresql(database_url: str, tmp_path: Any) -> None:
    from mainspring.producer import producer

    async with producer(database=database_url, data_dir=tmp_path) as mainspring:
        await mainspring.create("q", {"n": -1})  # warm: the queue row, prepared statements
        backend = mainspring.store.backend
        before = backend.round_trips
        for i in range(CREATES):
            await mainspring.create("q", {"n": i})
        per_create = (backend.round_trips - before) / CREATES
        before = backend.round_trips
        for start in range(0, CREATES, 5):
            made = await mainspring.create_many("q", [{"data": {"n": n}, "message_id": f"m{n}"} for n in range(start, start + 5)])
            assert [m["data"] for m in made] == [{"n": n} for n in range(start, start + 5)]
        per_bulk = (backend.round_trips - before) / (CREATES / 5)
        items = await mainspring.create_many("q", [{"data": n} for n in range(3)])
    # PostgreSQL: the items, their events and their wake-ups in one autocommit statement (BEGIN, the statement,
    # NOTIFY + COMMIT for a bulk before). SQLite: BEGIN IMMEDIATE, the items, the events, COMMIT.
    assert per_create <= (1 if mainspring.store.is_postgres else 4), per_create
    assert per_bulk <= (1 if mainspring.store.is_postgres else 4 + 5), per_bulk
    assert len({i["id"] for i in items}) == 3


async def test_the_create_statement_is_planned_once_per_connection_not_at_every_create(database_url: str, engine: str) -> None:
    """PostgreSQL keeps a prepared statement's generic plan only when it does not look costlier than the custom
    plans it made at the first five runs: the items' arrays, planned as constants, gave exact row counts that
    made every custom plan look cheaper, so the create was planned again at every run (~0.3 ms of the
    database's CPU each, bench/create_statement.py)."""
    if engine != "postgres":
        pytest.skip("plan caches of prepared statements are PostgreSQL's")
    from mainspring.interactions import service
    from mainspring.interactions.settings import InteractionsSettings
    from mainspring.store.migrate import migrate

    store = Store(database_url, pool_size=1)
    try:
        await migrate(store)
        cfg = InteractionsSettings()
        for i in range(12):
            await service.create(store, cfg, "q", {"data": {"n": i}})
        for size in (1, 3, 40):
            await service.create_many(store, cfg, "q", [{"data": n} for n in range(size)])
        async with store.read() as session:
            plans = (await session.execute(
                text("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE :create"),
                {"create": "WITH ins AS (INSERT INTO interactions%"},
            )).all()
    finally:
        await store.close()
    assert plans, "the create statement is prepared on the store's connection"
    assert sum(generic for generic, _ in plans) >= 8 and all(custom <= 5 for _, custom in plans), plans
