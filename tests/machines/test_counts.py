"""Machines by namespace and status (issue 26): kept with the writes (migration machines_0006, ``store.counts``),
so the overview and /metrics read them without counting the machines — and exact through every change of
status and a removal: each step compares them with a count of the rows themselves."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sqlalchemy import select, text

from mainspring.machines import data
from mainspring.machines.tables import machine_counts, machines
from mainspring.store import Store
from mainspring.store import counts as kept_counts
from mainspring.store.migrate import migrate
from tests.conftest import assert_counts_exact, upgrade_to
from tests.machines.conftest import NS, FakeProcessor
from tests.machines.test_seed_failures import refuse
from tests.machines.test_seed_lifecycle import BASE, put_ns


async def exact(store: Store) -> list[tuple[str, str, int]]:
    await assert_counts_exact(store, machine_counts, "machines", machines, "status", "namespace")
    async with store.read() as conn:
        return sorted(await data.count_by_namespace_and_status(conn))


async def test_machine_counts_stay_exact_through_failure_repair_and_removal(
    client: httpx.AsyncClient, fake: FakeProcessor, store: Store
) -> None:
    await put_ns(client)
    for machine_id in ("m1", "m2", "m3"):
        assert (await client.post(BASE, json={"id": machine_id})).status_code == 201
    assert await exact(store) == [(NS, "working", 3)]

    fake.on("call", refuse)  # a permanent refusal fails the machine
    assert (await client.post(f"{BASE}/m2/call", json={"args": None})).status_code == 502
    assert await exact(store) == [(NS, "failed", 1), (NS, "working", 2)]
    async with store.read() as conn:
        assert await data.count_by_status(conn) == {"failed": 1, "working": 2}

    assert (await client.post(f"{BASE}/m2/repair", json={"simple": True})).status_code == 200
    assert (await client.delete(f"{BASE}/m1")).status_code == 204
    assert await exact(store) == [(NS, "working", 2)]


async def _insert_machines(store: Store, namespace: str, ids: range, status: str = "working") -> None:
    async with store.transaction() as tx:
        for i in ids:
            await tx.execute(text(
                "INSERT INTO machines (namespace, id, status, version, last_event_id, retry_attempt, created_at, updated_at) "
                "VALUES (:ns, :id, :status, 1, 0, 0, 1, 1)"), {"ns": namespace, "id": f"m{i}", "status": status})


async def test_machines_stored_before_the_upgrade_are_counted_by_it(blank_database_url: str) -> None:
    store = Store(blank_database_url)
    try:
        await store.run_sync(upgrade_to("machines_0005"))
        await _insert_machines(store, "a", range(3))
        await _insert_machines(store, "b", range(2), status="failed")
        await migrate(store)
        assert await exact(store) == [("a", "working", 3), ("b", "failed", 2)]
        await _insert_machines(store, "b", range(5, 6))  # and the triggers count from there on
        assert await exact(store) == [("a", "working", 3), ("b", "failed", 2), ("b", "working", 1)]
    finally:
        await store.close()


async def test_rows_of_gone_backends_fold_into_one_slot_with_the_totals_unchanged(store: Store, database_url: str) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite has one writer: slot 0 only")
    for n, other in enumerate([Store(database_url, pool_size=1) for _ in range(3)]):
        try:
            await other.start()
            await _insert_machines(other, "a", range(n * 10, n * 10 + 4))
        finally:
            await other.close()
    before = await exact(store)
    assert before == [("a", "working", 12)]
    for _ in range(50):  # a closed connection's backend may take a moment to leave pg_stat_activity
        async with store.transaction() as tx:
            await kept_counts.fold(tx, machine_counts)
        async with store.read() as conn:
            slots = set((await conn.execute(select(machine_counts.c.slot))).scalars())
        if slots == {0}:
            break
        await asyncio.sleep(0.1)
    assert slots == {0}
    assert await exact(store) == before
