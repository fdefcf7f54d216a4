"""The machines face's reads keep their partial indexes when PostgreSQL plans them generically (a prepared
statement's plan from its sixth run: ``store.schema.constant``)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from mainspring.machines import data
from mainspring.store import Store
from tests.conftest import generic_plan, statements_sent


async def test_the_due_timers_of_metrics_read_the_timers_index_in_a_generic_plan(store: Store, database_url: str, engine: str) -> None:
    if engine != "postgres":
        pytest.skip("generic plans of prepared statements are PostgreSQL's")
    async with store.transaction() as tx:
        await tx.execute(text(
            "INSERT INTO machines (namespace, id, status, version, last_event_id, timer_at, retry_attempt, created_at, updated_at) "
            "SELECT 'orders', 'm' || n, 'working', 1, 0, CASE WHEN n % 1000 = 0 THEN n END, 0, 0, 0 "
            "FROM generate_series(1, 20000) AS n"
        ))
        await tx.execute(text("ANALYZE machines"))
    with statements_sent(store) as sent:
        async with store.read() as conn:
            due = await data.due_timers_by_namespace(conn, 1_000_000)
    assert due == [("orders", 20, 1000)]
    (statement, parameters), = sent
    plan = await generic_plan(database_url, statement, parameters)
    assert "Seq Scan on machines" not in plan, plan
