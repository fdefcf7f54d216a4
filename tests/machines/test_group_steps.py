"""Steps of different machines share one statement and one commit; reads of different machines share two
statements. Sharing must never weaken a step: the version guard still applies an answer at most once, a row
another transaction holds is waited for alone, and each reader gets its own machine or its own 404."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from mainspring.machines import data
from mainspring.machines.data import Applied
from mainspring.machines.processor import Answer
from mainspring.machines.steps import applied_once, pending_step
from mainspring.store import Store
from tests.machines.conftest import NS, FakeProcessor

BASE = f"/v1/namespaces/{NS}/machines"


async def _machine(store: Store, machine_id: str) -> data.MachineRow:
    async with store.read() as conn:
        machine = await data.get_machine(conn, NS, machine_id)
    assert machine is not None
    return machine


async def _history(client: httpx.AsyncClient, machine_id: str) -> list[object]:
    body = (await client.get(f"{BASE}/{machine_id}")).json()
    return [e["data"] for e in body["history"]]


async def test_calls_on_many_machines_arriving_together_cost_under_half_the_round_trips_of_one_call_alone_on_postgres(
    store: Store, client: httpx.AsyncClient, fake: FakeProcessor
) -> None:
    if not store.is_postgres:
        pytest.skip("SQLite runs in this process: its statements are not round trips, and each step writes its rows itself")
    machines = 16
    for i in range(machines):
        assert (await client.post(BASE, json={"id": f"m{i}"})).status_code == 201
    assert (await client.post(f"{BASE}/m0/call", json={"args": "warm"})).status_code == 200
    before = store.backend.round_trips
    assert (await client.post(f"{BASE}/m0/call", json={"args": "alone"})).status_code == 200
    alone = store.backend.round_trips - before
    before = store.backend.round_trips
    replies = await asyncio.gather(*(client.post(f"{BASE}/m{i}/call", json={"args": i}) for i in range(machines)))
    assert [r.status_code for r in replies] == [200] * machines
    together = (store.backend.round_trips - before) / machines
    assert together < alone / 2, (together, alone)
    for i in range(1, machines):
        assert (await _history(client, f"m{i}"))[1:] == [{"called": i}]


async def test_two_answers_computed_from_one_version_in_one_group_are_applied_once(store: Store, client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    assert (await client.post(BASE, json={"id": "m1"})).status_code == 201
    machine = await _machine(store, "m1")
    first = pending_step(machine, Answer(events=["first"]), store.now_ms())
    second = pending_step(machine, Answer(events=["second"]), store.now_ms())
    outcomes = await asyncio.gather(applied_once(store, first), applied_once(store, second))
    assert sorted(o.value for o in outcomes) == sorted([Applied.APPLIED.value, Applied.MOVED_ON.value])
    history = (await _history(client, "m1"))[1:]
    assert history in (["first"], ["second"])
    assert (await _machine(store, "m1")).version == machine.version + 1


async def test_an_answer_computed_from_a_version_the_machine_left_changes_nothing_even_when_no_event_collides(
    store: Store, client: httpx.AsyncClient, fake: FakeProcessor
) -> None:
    """The version fence itself: the first answer adds no event (only the aux state), so the stale one's event would
    take the next history id without a collision — only the version it read keeps it out."""
    assert (await client.post(BASE, json={"id": "m1"})).status_code == 201
    machine = await _machine(store, "m1")
    quiet = pending_step(machine, Answer(aux_state={"by": "first"}), store.now_ms())
    stale = pending_step(machine, Answer(events=["stale"], aux_state={"by": "stale"}), store.now_ms())
    assert await applied_once(store, quiet) is Applied.APPLIED
    assert await applied_once(store, stale) is Applied.MOVED_ON
    after = await _machine(store, "m1")
    assert (after.version, after.aux_state, after.last_event_id) == (machine.version + 1, {"by": "first"}, machine.last_event_id)
    assert (await _history(client, "m1"))[1:] == []


async def test_a_step_whose_machine_row_another_transaction_holds_waits_for_it_alone_and_applies_once(
    store: Store, client: httpx.AsyncClient, fake: FakeProcessor
) -> None:
    if not store.is_postgres:
        pytest.skip("SQLite has one writer: no other transaction can hold a row while a step writes")
    assert (await client.post(BASE, json={"id": "m1"})).status_code == 201
    machine = await _machine(store, "m1")
    held = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with store.transaction() as tx:
            await data.lock_machine(tx, NS, "m1")
            held.set()
            await release.wait()

    holding = asyncio.create_task(holder())
    await held.wait()
    step = asyncio.create_task(applied_once(store, pending_step(machine, Answer(events=["after the holder"]), store.now_ms())))
    await asyncio.sleep(0.3)
    assert not step.done(), "the step must wait for the row, not skip it and give up"
    release.set()
    await holding
    assert await step is Applied.APPLIED
    assert (await _history(client, "m1"))[1:] == ["after the holder"]


async def test_reads_grouped_together_answer_each_caller_its_own_machine_or_its_own_not_found(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    for i in range(0, 12, 2):
        assert (await client.post(BASE, json={"id": f"m{i}"})).status_code == 201
    ids = [f"m{i}" if i % 2 == 0 else f"missing{i}" for i in range(12)]
    replies = await asyncio.gather(*(client.post(f"{BASE}/{machine_id}/call", json={"args": machine_id}) for machine_id in ids))
    for machine_id, reply in zip(ids, replies, strict=True):
        if machine_id.startswith("missing"):
            assert reply.status_code == 404 and reply.json()["code"] == "machine_not_found", reply.text
        else:
            assert reply.status_code == 200 and reply.json() == {"response": {"echo": machine_id}}, reply.text
    other = await client.post("/v1/namespaces/nowhere/machines/m0/call", json={"args": 1})
    assert other.status_code == 404 and other.json()["code"] == "namespace_not_found", other.text


async def test_a_keyed_call_that_removes_its_machine_answers_a_repeat_the_same(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    fake.on("call", lambda args, machine: {"events": ["bye"], "response": "removed", "action": {"remove": True}})
    assert (await client.post(BASE, json={"id": "m1"})).status_code == 201
    headers = {"Idempotency-Key": "k1"}
    first = await client.post(f"{BASE}/m1/call", json={"args": 1}, headers=headers)
    assert first.status_code == 200 and first.json() == {"response": "removed"}, first.text
    assert (await client.get(f"{BASE}/m1")).status_code == 404
    repeat = await client.post(f"{BASE}/m1/call", json={"args": 1}, headers=headers)
    assert repeat.status_code == 200 and repeat.json() == {"response": "removed"}, repeat.text


async def test_a_group_read_of_any_size_answers_each_machine_with_its_history_bounded_by_the_row_read(
    store: Store, client: httpx.AsyncClient, fake: FakeProcessor
) -> None:
    """On PostgreSQL the group's keys are bound as arrays (one statement for every group size): each size, a
    key repeated or absent, still answers each machine, and a history never past the row as it was read."""
    for i in range(4):
        assert (await client.post(BASE, json={"id": f"m{i}"})).status_code == 201
    assert (await client.post(f"{BASE}/m1/call", json={"args": 1})).status_code == 200
    read = {i: await _machine(store, f"m{i}") for i in range(4)}
    assert (await client.post(f"{BASE}/m1/call", json={"args": 2})).status_code == 200  # after the row was read
    for size in (1, 2, 4):
        keys = [(NS, f"m{i}") for i in range(size)] + [(NS, "m0"), (NS, "absent")]
        async with store.read() as conn:
            found = await data.machines_and_namespaces(conn, keys)
            histories = await data.whole_histories(conn, [read[i] for i in range(size)])
        assert sorted(found) == [(NS, f"m{i}") for i in range(size)]
        assert all(machine.id == key[1] for key, (machine, _stored) in found.items())
        assert {uid: [e.data for e in events] for uid, events in histories.items()} == {
            read[i].uid: [{"started": None}, {"called": 1}] if i == 1 else [{"started": None}] for i in range(size)
        }
