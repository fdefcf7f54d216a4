"""Namespaces: stored, validated, and applied by every server without a restart."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from sqlalchemy import update

from mainspring.app import App, Registration
from mainspring.config import Settings
from mainspring.machines.tables import machines
from tests.machines.conftest import FakeProcessor, serve_fake, server_app


async def test_put_then_get_namespace_round_trips(client: httpx.AsyncClient) -> None:
    body = {"processor": {"url": "http://127.0.0.1:9/p", "timeout_ms": 1500}, "retry": {"initial_ms": 10, "factor": 1.5, "max_ms": 100, "max_attempts": 4, "max_total_ms": 1000}}
    assert (await client.put("/v1/namespaces/pay", json=body)).status_code == 200
    got = (await client.get("/v1/namespaces/pay")).json()
    assert got["processor"] == {**body["processor"], "protocol": "json"} and got["retry"]["max_attempts"] == 4 and got["retry"]["max_total_ms"] == 1000


async def test_bad_namespace_bodies_and_names_are_422(client: httpx.AsyncClient) -> None:
    for body in ({"processor": {"url": "ftp://x"}}, {"retry": {"factor": 0.5}}, {"retry": {"initial_ms": -1}}, {"unknown": 1}, [1]):
        reply = await client.put("/v1/namespaces/pay", json=body)
        assert reply.status_code == 422 and reply.json()["code"] == "invalid_request", body
    assert (await client.put("/v1/namespaces/a%00b", json={})).status_code == 422  # NUL: PostgreSQL cannot store it
    assert (await client.put(f"/v1/namespaces/{'n' * 1025}", json={})).status_code == 422  # past 1 KiB
    assert (await client.get("/v1/namespaces/none")).json()["code"] == "namespace_not_found"


async def test_bad_machine_requests_are_422_and_change_nothing(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    for body in ({"id": "a\u0000b"}, {"id": "i" * 1025}, {"id": ""}, {"args": 1}, {"id": "x", "args": "\u0000"}, {"id": "x", "extra": 1}):
        reply = await client.post("/v1/namespaces/orders/machines", json=body)
        assert reply.status_code == 422 and reply.json()["code"] == "invalid_request", body
    reply = await client.post("/v1/namespaces/orders/machines", content=b"{not json", headers={"content-type": "application/json"})
    assert reply.status_code == 422
    assert fake.calls == []


async def test_a_namespace_changed_on_one_server_applies_on_another_without_restart(settings: Settings) -> None:
    first, second = FakeProcessor(), FakeProcessor()
    second.on("call", lambda a, m: {"response": "from the second processor"})
    async with serve_fake(first) as url1, serve_fake(second) as url2:
        async with server_app(settings) as server_a, server_app(settings) as server_b:
            assert (await server_a.put("/v1/namespaces/pay", json={"processor": {"url": url1}})).status_code == 200
            assert (await server_b.post("/v1/namespaces/pay/machines", json={"id": "m1"})).status_code == 201
            assert (await server_b.post("/v1/namespaces/pay/machines/m1/call", json={})).json() == {"response": {"echo": None}}
            await server_a.put("/v1/namespaces/pay", json={"processor": {"url": url2}})
            assert (await server_b.post("/v1/namespaces/pay/machines/m1/call", json={})).json() == {"response": "from the second processor"}
    assert first.kinds() == ["init", "call"] and second.kinds() == ["call"]


async def test_namespaces_from_the_config_file_are_stored_at_start(settings: Settings) -> None:
    configured = settings.model_copy(deep=True)
    configured.machines.namespaces = {"billing": configured.machines.namespaces.get("billing") or _ns(timeout_ms=777)}
    async with server_app(configured) as server:
        got = (await server.get("/v1/namespaces/billing")).json()
    assert got["processor"]["timeout_ms"] == 777
    async with server_app(settings) as other:
        assert (await other.get("/v1/namespaces/billing")).json()["processor"]["timeout_ms"] == 777


def _ns(**processor: Any) -> Any:
    from mainspring.machines.settings import NamespaceConfig, ProcessorConfig

    return NamespaceConfig(processor=ProcessorConfig(**processor))


async def test_in_process_processor_as_a_class_with_sync_methods(settings: Settings) -> None:
    class Counter:
        def init(self, args: Any, machine: Any) -> Any:
            return {"events": ["born"], "aux_state": 0}

        def call(self, args: Any, machine: Any) -> Any:
            return {"aux_state": machine["aux_state"] + args, "response": machine["aux_state"] + args}

    registry = App()
    registry.processors["counters"] = Registration(Counter)
    async with server_app(settings, registry) as server:
        assert (await server.post("/v1/namespaces/counters/machines", json={"id": "c"})).status_code == 201
        assert (await server.post("/v1/namespaces/counters/machines/c/call", json={"args": 5})).json() == {"response": 5}
        assert (await server.post("/v1/namespaces/counters/machines/c/call", json={"args": 2})).json() == {"response": 7}
        assert (await server.get("/v1/namespaces/counters")).json()["in_process"] is True


async def test_the_namespace_history_range_is_what_the_processor_is_sent(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    fake.on("init", lambda a, m: {"events": [1, 2, 3, 4]})
    await client.post("/v1/namespaces/orders/machines", json={"id": "m1"})
    await client.post("/v1/namespaces/orders/machines/m1/call", json={})
    assert [e["id"] for e in fake.calls[-1][2]["history"]] == [1, 2, 3, 4]
    await client.put("/v1/namespaces/orders", json={"history": {"limit": 2, "direction": "backward"}})
    await client.post("/v1/namespaces/orders/machines/m1/call", json={})
    assert [e["id"] for e in fake.calls[-1][2]["history"]] == [5, 4]


async def test_due_machines_read_as_one_batch_each_get_their_own_head_notification_and_history_range(settings: Settings) -> None:
    from mainspring.machines.background import lease_due_machines, read_due

    fake = FakeProcessor()
    fake.on("init", lambda args, machine: {"events": args})
    registry = App()
    registry.processors["orders"] = Registration(fake)
    registry.processors["brief"] = Registration(fake)
    async with server_app(settings, registry, background=False) as client:
        ctx = client._transport.app.state.context  # type: ignore[attr-defined]
        assert (await client.put("/v1/namespaces/brief", json={"history": {"limit": 1, "direction": "backward"}})).status_code == 200
        for ns, machine_id, events in (("orders", "a1", [1, 2, 3]), ("orders", "a2", ["x"]), ("brief", "b1", ["p", "q"]), ("orders", "a3", [])):
            assert (await client.post(f"/v1/namespaces/{ns}/machines", json={"id": machine_id, "args": events})).status_code == 201
        for ns, machine_id, args in (("orders", "a1", "first"), ("orders", "a1", "second"), ("brief", "b1", "only"), ("orders", "a2", "one")):
            assert (await client.post(f"/v1/namespaces/{ns}/machines/{machine_id}/notifications", json={"args": args})).status_code == 202
        due = {d.machine.id: d for d in await read_due(ctx, await lease_due_machines(ctx, 10))}
    assert sorted(due) == ["a1", "a2", "b1"]
    assert due["a1"].head.args == "first"
    assert [e.data for e in due["a1"].events] == [1, 2, 3]
    assert due["a2"].head.args == "one" and [e.data for e in due["a2"].events] == ["x"]
    assert due["b1"].head.args == "only" and [e.data for e in due["b1"].events] == ["q"]


async def test_due_machines_are_leased_with_their_namespaces_in_one_round_trip_for_their_namespace_timeout_or_their_timers_longer_one(
    settings: Settings,
) -> None:
    from mainspring.machines.background import lease_due_machines

    fake = FakeProcessor()
    registry = App()
    for ns in ("orders", "quick"):
        registry.processors[ns] = Registration(fake)
    fake.on("init", lambda args, machine: {"events": [], "action": {"timer": {"in_ms": args}}})
    # Timers far apart in the real clock (a loaded machine takes hundreds of ms between two creates), all inside a
    # lookahead long enough to lease them now.
    settings = settings.model_copy(update={"machines": settings.machines.model_copy(update={"timer_lookahead_ms": 600_000})})
    async with server_app(settings, registry, background=False) as client:
        ctx = client._transport.app.state.context  # type: ignore[attr-defined]
        assert (await client.put("/v1/namespaces/quick", json={"processor": {"timeout_ms": 1_234}})).status_code == 200
        for ns, machine_id, in_ms in (("orders", "late", 120_000), ("quick", "early", 0), ("quick", "own", 60_000)):
            assert (await client.post(f"/v1/namespaces/{ns}/machines", json={"id": machine_id, "args": in_ms})).status_code == 201, machine_id
        async with ctx.store.transaction() as tx:  # a timer with its own timeout (Machinegun's SetTimerAction.timeout)
            await tx.execute(update(machines).where(machines.c.id == "own").values(timer_timeout_ms=60_000))
        before, now = ctx.store.backend.round_trips, ctx.now_ms()
        batch = await lease_due_machines(ctx, 10)
        trips = ctx.store.backend.round_trips - before
    leased = batch.machines
    assert [m.id for m in leased] == ["early", "own", "late"]
    quick = batch.namespaces["quick"]
    assert quick is not None and quick.timeout_ms == 1_234 and batch.namespaces == {"orders": None, "quick": quick}  # orders: in-process, not stored
    margin = settings.machines.lease_margin_ms + settings.machines.timer_lookahead_ms
    expiry = {m.id: m.lease_expires_at - now for m in leased}  # type: ignore[operator]
    assert 1_234 + margin <= expiry["early"] < 1_234 + margin + 1_000, expiry
    assert 60_000 + margin <= expiry["own"] < 60_000 + margin + 1_000, expiry
    assert 30_000 + margin <= expiry["late"] < 30_000 + margin + 1_000, expiry  # the default timeout
    if ctx.store.is_postgres:
        assert trips == 1, trips


@contextlib.asynccontextmanager
async def _due_now(settings: Settings, fake: FakeProcessor, on_timeout: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A server without its background loop, 8 machine workers, whose new machines of ``orders`` are due at once
    and answer ``timeout`` with ``on_timeout``."""
    fake.on("init", lambda args, machine: {"events": [], "action": {"timer": {"in_ms": 0}}})
    fake.on("timeout", on_timeout)
    registry = App()
    registry.processors["orders"] = Registration(fake)
    busy = settings.model_copy(update={"machines": settings.machines.model_copy(update={"concurrency": 8, "timer_lookahead_ms": 0})})
    async with server_app(busy, registry, background=False) as client:
        yield client


async def test_a_burst_of_due_timers_is_leased_half_the_workers_at_a_time_so_the_next_batch_is_leased_while_one_runs(settings: Settings) -> None:
    import asyncio

    from mainspring.machines.background import INFLIGHT, INFLIGHT_COUNT, take_due_timers

    fake = FakeProcessor()
    release = asyncio.Event()
    fired: list[str] = []

    async def timeout(args: Any, machine: Any) -> Any:
        fired.append(machine["id"])
        await release.wait()
        return {"events": ["fired"]}

    async with _due_now(settings, fake, timeout) as client:
        ctx = client._transport.app.state.context  # type: ignore[attr-defined]
        for i in range(12):
            assert (await client.post("/v1/namespaces/orders/machines", json={"id": f"m{i}"})).status_code == 201
        assert await take_due_timers(ctx) is not None  # a first batch of 4, and room for more: look again at once
        assert ctx.extras[INFLIGHT_COUNT]["rows"] == 4
        assert await take_due_timers(ctx) is None  # the second batch of 4 fills the workers
        assert ctx.extras[INFLIGHT_COUNT]["rows"] == 8 and len(ctx.extras[INFLIGHT]) == 2
        release.set()
        await asyncio.gather(*ctx.extras[INFLIGHT])
        for _round in range(10):
            await take_due_timers(ctx)
            await asyncio.gather(*ctx.extras[INFLIGHT])
            if len(fired) == 12:
                break
    assert sorted(fired) == sorted(f"m{i}" for i in range(12))


async def test_a_due_machine_gives_its_worker_back_when_its_own_step_ends_not_when_the_slowest_of_its_batch_does(settings: Settings) -> None:
    import asyncio

    from mainspring.machines.background import INFLIGHT, INFLIGHT_COUNT, take_due_timers

    fake = FakeProcessor()
    release = asyncio.Event()
    fired: list[str] = []

    async def timeout(args: Any, machine: Any) -> Any:
        if machine["id"] == "m0":
            await release.wait()  # the slowest step of the first batch
        fired.append(machine["id"])
        return {"events": ["fired"]}

    async with _due_now(settings, fake, timeout) as client:
        ctx = client._transport.app.state.context  # type: ignore[attr-defined]
        for i in range(6):
            assert (await client.post("/v1/namespaces/orders/machines", json={"id": f"m{i}"})).status_code == 201
        await take_due_timers(ctx)  # a batch of 4, m0 among them
        for _ in range(500):
            if ctx.extras[INFLIGHT_COUNT]["rows"] == 1:
                break
            await asyncio.sleep(0.01)
        # Only the step still running holds a worker: the other three gave theirs back as they ended.
        assert ctx.extras[INFLIGHT_COUNT]["rows"] == 1 and len(fired) == 3 and "m0" not in fired
        release.set()
        await asyncio.gather(*ctx.extras[INFLIGHT])
        assert ctx.extras[INFLIGHT_COUNT]["rows"] == 0


async def test_an_in_process_namespace_that_is_not_stored_is_built_once_not_on_every_step(settings: Settings) -> None:
    from mainspring.machines.namespaces import namespace_of

    registry = App()
    registry.processors["local"] = Registration(FakeProcessor())
    async with server_app(settings, registry, background=False) as client:
        ctx = client._transport.app.state.context  # type: ignore[attr-defined]
        first, again = namespace_of(ctx, "local", None), namespace_of(ctx, "local", None)
    assert first is again and not first.stored


async def test_a_lease_of_due_machines_takes_no_more_than_its_limit_after_its_statement_ran_many_times(settings: Settings) -> None:
    """The generic plan of a prepared statement must not run the pick of due machines once per row."""
    from mainspring.machines.background import lease_due_machines

    fake = FakeProcessor()
    registry = App()
    registry.processors["orders"] = Registration(fake)
    fake.on("init", lambda args, machine: {"events": [], "action": {"timer": {"in_ms": 0}}})
    async with server_app(settings, registry, background=False) as client:
        ctx = client._transport.app.state.context  # type: ignore[attr-defined]
        for _ in range(8):
            assert (await lease_due_machines(ctx, 1)).machines == []
        for i in range(12):
            assert (await client.post("/v1/namespaces/orders/machines", json={"id": f"m{i}"})).status_code == 201
        assert len((await lease_due_machines(ctx, 1)).machines) == 1
        assert len((await lease_due_machines(ctx, 2)).machines) == 2
