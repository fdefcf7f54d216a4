"""Call and Start stay short: the statements (on PostgreSQL, round trips) each costs are counted, so a change
that adds one fails here."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from mainspring.app import App
from mainspring.config import Settings
from mainspring.store import Store
from tests.conftest import quiet_app_client
from tests.machines.conftest import FakeProcessor

BASE = "/v1/namespaces/orders/machines"
REQUESTS = 20


@pytest.fixture
async def quiet_client(settings: Settings, store: Store, registry: App, fake: FakeProcessor) -> AsyncIterator[httpx.AsyncClient]:
    """See ``tests.conftest.quiet_app_client``."""
    async with quiet_app_client(settings, store, registry) as client:
        yield client


async def _statements_per_request(store: Store, client: httpx.AsyncClient, requests: list[tuple[str, dict[str, object]]]) -> float:
    before = store.backend.round_trips
    for path, body in requests:
        answer = await client.post(path, json=body)
        assert answer.is_success, answer.text
    return (store.backend.round_trips - before) / len(requests)


async def test_a_call_reads_in_two_statements_and_commits_in_one_round_trip_on_postgres(store: Store, quiet_client: httpx.AsyncClient) -> None:
    assert (await quiet_client.post(BASE, json={"id": "m1"})).status_code == 201
    assert (await quiet_client.post(f"{BASE}/m1/call", json={"args": 0})).status_code == 200  # warm
    per_call = await _statements_per_request(store, quiet_client, [(f"{BASE}/m1/call", {"args": i}) for i in range(REQUESTS)])
    # PostgreSQL: the machine with its namespace, its history; one autocommit statement writing the row, its
    # history, their events and the wake-ups. SQLite: the same reads, BEGIN IMMEDIATE, row, history, events, COMMIT.
    assert per_call <= (3 if store.is_postgres else 8), per_call


async def test_a_start_costs_a_few_statements(store: Store, quiet_client: httpx.AsyncClient) -> None:
    assert (await quiet_client.post(BASE, json={"id": "warm"})).status_code == 201
    per_start = await _statements_per_request(store, quiet_client, [(BASE, {"id": f"m{i}"}) for i in range(REQUESTS)])
    # PostgreSQL: the namespace and whether the id is taken; BEGIN, the machine, its history, its events, COMMIT.
    assert per_start <= (6 if store.is_postgres else 7), per_start


async def test_a_batch_of_due_timers_is_leased_with_its_namespaces_and_read_in_one_more_statement(
    store: Store, quiet_client: httpx.AsyncClient, fake: FakeProcessor
) -> None:
    """PostgreSQL: the lease reads the namespaces too, and the batch's histories are one statement; the heads
    of notification queues are asked for only when a leased machine has pending notifications."""
    from mainspring.machines.background import lease_due_machines, read_due

    ctx = quiet_client._transport.app.state.context  # type: ignore[attr-defined]
    fake.on("init", lambda args, machine: {"events": ["started"], "action": {"timer": {"in_ms": 0}}})
    for i in range(5):
        assert (await quiet_client.post(BASE, json={"id": f"t{i}"})).status_code == 201
    before = store.backend.round_trips
    batch = await lease_due_machines(ctx, 10)
    leased_trips = store.backend.round_trips - before
    due = await read_due(ctx, batch)
    read_trips = store.backend.round_trips - before - leased_trips
    assert sorted(d.machine.id for d in due) == [f"t{i}" for i in range(5)]
    assert all(d.namespace is not None and d.head is None and [e.data for e in d.events] == ["started"] for d in due)
    # SQLite: BEGIN IMMEDIATE, the lease, the namespaces, COMMIT; then a snapshot's BEGIN and the histories.
    assert (leased_trips, read_trips) == ((1, 1) if store.is_postgres else (4, 2)), (leased_trips, read_trips)
