"""Counts by status (issue 26): kept with the writes in the same transaction (migration interactions_0011),
so ``GET /v1/queues/{q}``, the overview and ``/metrics`` read them without counting the items — and they are
exact: each test checks them against a count of the rows themselves."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import case, func, select, text

from mainspring.interactions import data, leasing, service
from mainspring.interactions.outcomes import Complete
from mainspring.interactions.settings import InteractionsSettings
from mainspring.interactions.tables import interaction_counts
from mainspring.interactions.tables import interactions as items
from mainspring.store import ManualClock, Store
from tests.conftest import eventually
from tests.interactions.conftest import create, lease, put_queue, release

CFG = InteractionsSettings()


async def counted_by_rows(store: Store, queue: str) -> dict[str, int]:
    """The counts as the rows say (what the API answered before the counts were kept)."""
    now = store.now_ms()
    status = case(
        (items.c.state != "queued", items.c.state),
        (items.c.next_processing.is_(None), "waiting"),
        (items.c.next_processing > now, "scheduled"),
        else_="ready",
    )
    async with store.read() as conn:
        rows = (await conn.execute(select(status, func.count()).where(items.c.queue == queue).group_by(status))).all()
    found = {str(s): int(n) for s, n in rows}
    return {s: found.get(s, 0) for s in service.STATUSES}


async def api_counts(client: httpx.AsyncClient, queue: str = "q") -> dict[str, int]:
    body = (await client.get(f"/v1/queues/{queue}")).json()
    assert body["counts_estimated"] == []
    return body["counts"]  # type: ignore[no-any-return]


async def test_queue_counts_follow_every_change_exactly(client: httpx.AsyncClient, store: Store, clock: ManualClock) -> None:
    for _ in range(6):
        await create(client)
    await create(client, process_in_ms=60_000)
    parent = await create(client)
    [leased] = await lease(client, max=1)
    await release(client, leased, {"wait": {}})  # waiting: queued without a due time
    for outcome in ({"complete": {}}, {"fail": {"error": "no"}}):
        [leased] = await lease(client, max=1)
        await release(client, leased, outcome)
    cancelled = await create(client)
    await client.post(f"/v1/interactions/{cancelled['id']}/cancel")
    # one left processing; its lease outlasts the clock's jumps below, or the server's sweeper could expire it
    # between the two counts this test compares
    await lease(client, max=1, lease_ms=3_600_000)
    await create(client, queue="other")
    assert await api_counts(client) == await counted_by_rows(store, "q")
    assert (await api_counts(client))["waiting"] == 1 and parent["status"] == "ready"

    clock.advance(60_000)  # the scheduled one is ready now: the split follows the clock
    assert await api_counts(client) == await counted_by_rows(store, "q")
    await put_queue(client, retention_ms=1000)
    clock.advance(2_000)
    await service.prune_finished(store, batch=100)  # retention deletes: the counts go down

    async def pruned() -> bool:  # (the server's own retention loop may be deleting at the same moment)
        after = await api_counts(client)
        return after == await counted_by_rows(store, "q") and (after["completed"], after["failed"], after["cancelled"]) == (0, 0, 0)

    await eventually(pruned, what="the counts after retention")
    assert await api_counts(client, "other") == await counted_by_rows(store, "other")


async def test_counts_follow_rows_changed_by_direct_sql(client: httpx.AsyncClient, store: Store) -> None:
    for _ in range(3):
        await create(client)
    async with store.transaction() as tx:  # an operator's UPDATE and DELETE, outside the service
        await tx.execute(text("UPDATE interactions SET state = 'failed', next_processing = NULL WHERE id = (SELECT min(id) FROM interactions)"))
        await tx.execute(text("DELETE FROM interactions WHERE id = (SELECT max(id) FROM interactions)"))
        await tx.execute(text("UPDATE interactions SET queue = 'moved' WHERE state = 'queued'"))
    assert await api_counts(client) == await counted_by_rows(store, "q")
    assert await api_counts(client, "moved") == await counted_by_rows(store, "moved") != {s: 0 for s in service.STATUSES}


async def test_one_statement_moving_rows_several_ways_keeps_the_counts_exact(client: httpx.AsyncClient, store: Store) -> None:
    # PostgreSQL counts an UPDATE once per statement (migration interactions_0013): moves that cancel out
    # within a (queue, status) pair, and moves between queues, in one statement.
    for _ in range(5):
        await create(client)
    await lease(client, max=2)
    async with store.transaction() as tx:
        # (A processing item holds a lease token and no other does: PostgreSQL's check constraint, interactions_0018.)
        await tx.execute(text("UPDATE interactions SET state = CASE WHEN state = 'queued' THEN 'processing' ELSE 'queued' END, "
                              "lease_token = CASE WHEN state = 'queued' THEN 'operator' END, next_processing = COALESCE(next_processing, 0)"))
        await tx.execute(text("UPDATE interactions SET queue = CASE WHEN id % 2 = 0 THEN 'other' ELSE queue END, "
                              "next_processing = CASE WHEN state = 'queued' AND id % 3 = 0 THEN NULL ELSE next_processing END"))
        await tx.execute(text("UPDATE interactions SET updated_at = updated_at + 1"))  # no status moves
    assert await api_counts(client) == await counted_by_rows(store, "q")
    assert await api_counts(client, "other") == await counted_by_rows(store, "other") != {s: 0 for s in service.STATUSES}
    assert (await api_counts(client))["processing"] + (await api_counts(client, "other"))["processing"] == 3


async def test_a_rolled_back_write_leaves_the_counts_as_they_were(client: httpx.AsyncClient, store: Store) -> None:
    await create(client)
    before = await api_counts(client)
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await tx.execute(text("UPDATE interactions SET state = 'completed'"))
            raise RuntimeError("the write fails after its statements")
    assert await api_counts(client) == before == await counted_by_rows(store, "q")


async def test_overview_and_metrics_show_the_kept_counts(client: httpx.AsyncClient, store: Store) -> None:
    await create(client)
    await create(client, process_in_ms=60_000)
    metrics = (await client.get("/metrics")).text
    assert 'mainspring_interactions{queue="q",status="ready"} 1.0' in metrics
    assert 'mainspring_interactions{queue="q",status="scheduled"} 1.0' in metrics
    assert "mainspring_interactions_estimated{" not in metrics
    overview = await client.get("/ui/overview/live")
    assert overview.status_code == 200


async def test_many_backends_writing_at_once_keep_exact_counts_and_gone_ones_are_folded(
        store: Store, database_url: str, clock: ManualClock) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite has one writer")
    others = [Store(database_url, clock=clock, pool_size=2) for _ in range(4)]
    try:
        await asyncio.gather(*(_create_and_finish(s, 16) for s in others))
    finally:
        for other in others:
            await other.close()
    async with store.read() as conn:
        slots = (await conn.execute(select(func.count(func.distinct(interaction_counts.c.slot))))).scalar_one()
    assert slots > 1  # each backend counted in rows of its own
    async with store.read() as conn:
        before = await data.count_by_status(conn, store, store.now_ms(), queue="busy")
    assert {s: before.by_queue["busy"].get(s, 0) for s in service.STATUSES} == await counted_by_rows(store, "busy")
    # The other stores are closed: their backends are gone, and their rows fold into slot 0, totals unchanged.
    for _ in range(50):
        async with store.transaction() as tx:
            await data.fold_counts(tx)
        async with store.read() as conn:
            left = (await conn.execute(select(func.count()).where(interaction_counts.c.slot.notin_([0]),
                                                                   interaction_counts.c.queue == "busy"))).scalar_one()
        if not left:
            break
        await asyncio.sleep(0.1)  # a closed connection's backend may take a moment to leave pg_stat_activity
    assert left == 0
    async with store.read() as conn:
        after = await data.count_by_status(conn, store, store.now_ms(), queue="busy")
    assert after == before


async def _create_and_finish(s: Store, n: int) -> None:
    """Creates, leases and releases from one more server's connections, all at once with the others."""
    await s.start()
    for i in range(n):
        await service.create(s, CFG, "busy", {"data": {"i": i}, "due_at": s.now_ms()})
    leased = (await leasing.lease(s, CFG, "busy", worker="w", max_items=n // 2)).items
    for item in leased[: len(leased) // 2]:
        await leasing.release(s, item["id"], item["lease"]["token"], Complete(None))


async def test_ready_and_scheduled_past_the_cap_are_labelled_estimated(
        client: httpx.AsyncClient, store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite counts the split exactly")
    monkeypatch.setattr(data.counts, "SCHEDULED_CAP", 3)
    for _ in range(4):
        await create(client)
        await create(client, process_in_ms=60_000)
    body: dict[str, Any] = (await client.get("/v1/queues/q")).json()
    assert body["counts_estimated"] == ["ready", "scheduled"]
    assert body["counts"]["ready"] + body["counts"]["scheduled"] == 8  # the queued total stays exact
    assert 'mainspring_interactions_estimated{queue="q",status="ready"} 1.0' in (await client.get("/metrics")).text
    page = (await client.get("/ui/interactions")).text
    assert "~" in page


async def test_past_the_cap_of_scheduled_items_few_ready_ones_keep_the_split_exact(
        client: httpx.AsyncClient, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The capped counts of both sides come from one statement: scheduled past the cap, ready under it — the
    split is the queued total minus the ready ones, exact; and ready past the cap alone is exact too."""
    monkeypatch.setattr(data.counts, "SCHEDULED_CAP", 3)
    for _ in range(4):
        await create(client, process_in_ms=60_000)
    for _ in range(2):
        await create(client)
    body: dict[str, Any] = (await client.get("/v1/queues/q")).json()
    assert (body["counts"]["ready"], body["counts"]["scheduled"], body["counts_estimated"]) == (2, 4, [])
    for _ in range(3):
        await create(client, queue="r")
    body = (await client.get("/v1/queues/r")).json()
    assert (body["counts"]["ready"], body["counts"]["scheduled"], body["counts_estimated"]) == (3, 0, [])
