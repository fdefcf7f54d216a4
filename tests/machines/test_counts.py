"""Machines by namespace and status (issue 26): kept with the writes (migration machines_0006, ``store.counts``),
so the overview and /metrics read them without counting the machines — and exact through every change of
status and a removal: each step compares them with a count of the rows themselves."""

from __future__ import annotations

import httpx

from mainspring.machines import data
from mainspring.machines.tables import machine_counts, machines
from mainspring.store import Store
from tests.conftest import assert_counts_exact
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
