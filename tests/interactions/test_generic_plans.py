"""The lease's statements keep their indexes when PostgreSQL plans them generically (issue 27's flood).

A statement prepared on a connection (SQLAlchemy's asyncpg cache) gets a generic plan after five executions,
planned without its parameters. A predicate bound as ``state = $1`` then implies no partial index's
``WHERE state = 'processing'``: the expired-lease check of every lease scanned the whole flooded queue.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text

from mainspring import worker as worker_runtime
from mainspring.app import App
from mainspring.config import load_settings
from mainspring.interactions import leasing, service
from mainspring.interactions.outcomes import Fail
from mainspring.interactions.settings import InteractionsSettings
from mainspring.interactions.worker import Worker
from mainspring.store import ManualClock, Store
from tests.conftest import eventually, generic_plan, statements_sent

CFG = InteractionsSettings()


async def test_a_lease_of_a_flooded_owned_queue_scans_no_items_in_a_generic_plan(store: Store, database_url: str, engine: str) -> None:
    if engine != "postgres":
        pytest.skip("generic plans of prepared statements are PostgreSQL's")
    await service.put_queue(store, CFG, "q", {"owner_by": "user", "fair": True, "per_owner": {"concurrency": 5}, "lease_ms": 60_000})
    await service.create_many(store, CFG, "q", [{"user": "small"}])
    async with store.transaction() as tx:
        await tx.execute(text(
            "INSERT INTO interactions (queue, \"user\", owner, priority, state, next_processing, attempts, created_at, updated_at) "
            "SELECT 'q', 'flood', 'flood', 0, 'queued', 0, 0, 0, 0 FROM generate_series(1, 20000)"
        ))
        await tx.execute(text("ANALYZE interactions"))
    with statements_sent(store) as sent:
        taken = (await leasing.lease(store, CFG, "q", "w", 3)).items
    assert taken
    reads = [(s, p) for s, p in sent if "interactions" in s and s.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE"))]
    assert reads
    for statement, parameters in reads:
        plan = await generic_plan(database_url, statement, parameters)
        assert "Seq Scan on interactions " not in plan, f"{statement}\n{plan}"


async def test_every_statement_of_a_workers_rounds_keeps_its_indexes_in_a_generic_plan(
        store: Store, database_url: str, engine: str, clock: ManualClock) -> None:
    """``mainspring worker`` runs its store with generic plans only (``Store(generic_plans=True)``): on a big
    store PostgreSQL otherwise re-plans the lease at every call (its generic plan, costed for an average
    queue, looked costlier than a custom one for a small queue). So each statement a worker sends must keep
    its index when planned without its parameters: leases, completions, failures and retries, heartbeats."""
    if engine != "postgres":
        pytest.skip("generic plans of prepared statements are PostgreSQL's")
    async with store.transaction() as tx:  # a store of many finished items in a few queues, analyzed
        await tx.execute(text(
            "INSERT INTO interactions (queue, \"user\", owner, priority, state, finished_at, attempts, created_at, updated_at) "
            "SELECT 'old' || (g % 4), 'u', '', 0, 'completed', 1, 1, 0, 0 FROM generate_series(1, 40000) AS g"
        ))
        await tx.execute(text("ANALYZE interactions"))
    await service.create_many(store, CFG, "q", [{"data": n} for n in range(6)])
    handled: list[int] = []
    app = App()

    @app.queue("q", lease_ms=1000, error_delay_ms=10)
    async def handle(item: Any) -> Any:
        handled.append(item.data)
        if item.data == 0 and len(handled) == 1:
            raise RuntimeError("once")  # a failed attempt, retried
        if item.data == 1:
            await asyncio.sleep(0.8)  # long enough for a heartbeat
        return Fail("no") if item.data == 2 else {"ok": item.data}

    with statements_sent(store) as sent:
        worker = Worker(store, app, CFG, poll_ms=100)
        await worker.start()
        try:
            await eventually(lambda: _all_finished(store, clock), what="every item finished")
        finally:
            await worker.stop()
    reads = {s: p for s, p in sent if "interactions" in s and s.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE", "DELETE"))}
    assert len(reads) >= 3
    for statement, parameters in reads.items():
        plan = await generic_plan(database_url, statement, parameters)
        assert "Seq Scan on interactions " not in plan, f"{statement}\n{plan}"


async def _all_finished(store: Store, clock: ManualClock) -> bool:
    clock.advance(20)  # the failed attempt's retry comes due
    async with store.read() as conn:
        left = (await conn.execute(text("SELECT count(*) FROM interactions WHERE queue = 'q' AND finished_at IS NULL"))).scalar_one()
    return bool(left == 0)


async def test_a_worker_on_the_store_plans_its_statements_generically(database_url: str, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if engine != "postgres":
        pytest.skip("plan_cache_mode is PostgreSQL's")
    store = Store(database_url, generic_plans=True)
    try:
        async with store.read() as conn:
            assert (await conn.execute(text("SHOW plan_cache_mode"))).scalar_one() == "force_generic_plan"
    finally:
        await store.close()
    made: list[dict[str, Any]] = []
    real = worker_runtime.Store

    def spy(*args: Any, **kwargs: Any) -> Store:
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(worker_runtime, "Store", spy)
    stop, ready = asyncio.Event(), asyncio.Event()
    app = App()
    app.queue("q")(lambda item: None)
    settings = load_settings(None, server={"database": database_url})
    running = asyncio.create_task(worker_runtime.run(settings, app, stop=stop, started=ready))
    try:
        await asyncio.wait_for(ready.wait(), 20)
    finally:
        stop.set()
        await asyncio.wait_for(running, 20)
    assert made and made[0].get("generic_plans") is True


async def test_the_one_call_fair_lease_scans_no_items_in_a_generic_plan(store: Store, database_url: str, engine: str) -> None:
    """The fair lease's function (migration interactions_0014) runs its statements from plpgsql's plan cache, generic
    plans included: each is EXPLAINed as it runs (auto_explain), none may scan ``interactions``."""
    if engine != "postgres":
        pytest.skip("the one-call fair lease is PostgreSQL's")
    await service.put_queue(store, CFG, "q", {"owner_by": "user", "fair": True, "per_owner": {"concurrency": 5}, "lease_ms": 60_000})
    await service.create_many(store, CFG, "q", [{"user": f"small{n}"} for n in range(20)])
    async with store.transaction() as tx:
        await tx.execute(text(
            "INSERT INTO interactions (queue, \"user\", owner, priority, state, next_processing, attempts, created_at, updated_at) "
            "SELECT 'q', 'flood', 'flood', 0, 'queued', 0, 0, 0, 0 FROM generate_series(1, 20000)"
        ))
        await tx.execute(text("ANALYZE interactions"))
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    plans: list[str] = []
    conn.add_log_listener(lambda _conn, message: plans.append(message.message))
    try:
        for setting in ("SET plan_cache_mode = force_generic_plan", "LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                        "SET auto_explain.log_nested_statements = on", "SET client_min_messages = log"):
            await conn.execute(setting)
        rows = await conn.fetch(
            "SELECT f.status, (f.item).id, (f.item).owner FROM mainspring_interactions_fair_lease($1, $2, $3, 'token', NULL, 'w', 'ch', 'seq', "
            "$4, $5) AS f", "q", store.now_ms(), 10, leasing.TURN_STRIDE, 1000,
        )
    finally:
        await conn.close()
    assert [r["status"] for r in rows] == ["ok"] * 10 and sum(r["owner"] == "flood" for r in rows) == 1, rows
    nested = [p for p in plans if "interactions" in p]
    assert len(nested) > 5, plans
    for plan in nested:
        assert "Seq Scan on interactions " not in plan, plan
