"""The lease's statements keep their indexes when PostgreSQL plans them generically (issue 27's flood).

A statement prepared on a connection (SQLAlchemy's asyncpg cache) gets a generic plan after five executions,
planned without its parameters. A predicate bound as ``state = $1`` then implies no partial index's
``WHERE state = 'processing'``: the expired-lease check of every lease scanned the whole flooded queue.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from sqlalchemy import event, text

from mainspring.interactions import leasing, service
from mainspring.interactions.settings import InteractionsSettings
from mainspring.store import Store
from tests.conftest import generic_plan

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
    sent: list[tuple[str, tuple[Any, ...]]] = []

    def keep(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        sent.append((statement, tuple(parameters or ())))

    sync_engine = store.backend.engine.sync_engine  # type: ignore[attr-defined]
    event.listen(sync_engine, "before_cursor_execute", keep)
    try:
        taken = (await leasing.lease(store, CFG, "q", "w", 3)).items
    finally:
        event.remove(sync_engine, "before_cursor_execute", keep)
    assert taken
    reads = [(s, p) for s, p in sent if "interactions" in s and s.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE"))]
    assert reads
    for statement, parameters in reads:
        plan = await generic_plan(database_url, statement, parameters)
        assert "Seq Scan on interactions " not in plan, f"{statement}\n{plan}"


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
