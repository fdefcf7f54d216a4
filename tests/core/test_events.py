"""The outbox: an event exists if and only if its change committed; readers never skip one."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from sqlalchemy import func, select

from mainspring.core import data as core_data
from mainspring.core import outbox
from mainspring.core.alerts import raise_alert
from mainspring.core.tables import alerts, events
from mainspring.store import ManualClock, Store


async def count(store: Store, table) -> int:  # type: ignore[no-untyped-def]
    async with store.read() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def settle(store: Store) -> None:
    """Let the PostgreSQL sequencer number what has committed (a no-op on SQLite)."""
    await outbox.wait_numbered(store)


async def test_event_is_written_when_its_change_commits(store: Store) -> None:
    async with store.transaction() as tx:
        await raise_alert(tx, "test_alert", "test", "one", "detail")
    await settle(store)
    assert await count(store, alerts) == 1
    items, _ = await outbox.read_events(store, 0, 10)
    assert [e["type"] for e in items] == ["alert.raised"]


async def test_failure_between_change_and_event_leaves_neither(store: Store) -> None:
    class Injected(Exception):
        pass

    with pytest.raises(Injected):
        async with store.transaction() as tx:
            await raise_alert(tx, "test_alert", "test", "one", "detail")
            raise Injected
    await settle(store)
    assert await count(store, alerts) == 0
    assert await count(store, events) == 0


async def test_readers_resume_from_a_cursor_without_skipping_or_repeating(store: Store) -> None:
    for i in range(25):
        async with store.transaction() as tx:
            await outbox.emit(tx, "test.n", "test", "s", {"n": i})
    await settle(store)
    seen: list[int] = []
    cursor = 0
    while True:
        items, cursor = await outbox.read_events(store, cursor, 7)
        if not items:
            break
        seen.extend(e["data"]["n"] for e in items)
    assert seen == list(range(25))


async def test_concurrent_transactions_get_dense_positions_in_commit_order(store: Store) -> None:
    async def write(i: int) -> None:
        async with store.transaction() as tx:
            await outbox.emit(tx, "test.n", "test", f"s{i % 5}", {"n": i})

    await asyncio.gather(*(write(i) for i in range(100)))
    await settle(store)
    items, _ = await outbox.read_events(store, 0, 1000)
    assert [int(e["id"]) for e in items] == list(range(1, 101))
    assert sorted(e["data"]["n"] for e in items) == list(range(100))


async def test_type_filter_with_prefix(store: Store) -> None:
    async with store.transaction() as tx:
        await outbox.emit(tx, "a.one", "t", "1")
        await outbox.emit(tx, "b.two", "t", "1")
        await outbox.emit(tx, "a.three", "t", "1")
    await settle(store)
    items, cursor = await outbox.read_events(store, 0, 10, ["a.*"])
    assert [e["type"] for e in items] == ["a.one", "a.three"]
    items, cursor2 = await outbox.read_events(store, cursor, 10, ["c.*"])
    assert items == [] and cursor2 >= cursor


async def test_events_endpoint_pages_with_next_cursor(client: httpx.AsyncClient, store: Store) -> None:
    async with store.transaction() as tx:
        for i in range(5):
            await outbox.emit(tx, "test.n", "test", "s", {"n": i})
    await settle(store)
    first = (await client.get("/v1/events", params={"limit": 3})).json()
    assert [e["data"]["n"] for e in first["events"]] == [0, 1, 2]
    second = (await client.get("/v1/events", params={"after": first["next_cursor"]})).json()
    assert [e["data"]["n"] for e in second["events"]] == [3, 4]
    event = second["events"][0]
    assert set(event) == {"id", "type", "at", "subject", "data"}
    assert event["subject"] == {"kind": "test", "id": "s"} and event["at"].endswith("Z")


async def test_events_long_poll_returns_when_an_event_commits(client: httpx.AsyncClient, store: Store) -> None:
    async def later() -> None:
        await asyncio.sleep(0.2)
        async with store.transaction() as tx:
            await outbox.emit(tx, "test.late", "test", "s")

    task = asyncio.create_task(later())
    response = await client.get("/v1/events", params={"wait_ms": 10_000})
    await task
    assert [e["type"] for e in response.json()["events"]] == ["test.late"]


async def test_sse_stream_delivers_live_in_order_and_resumes_from_cursor(live_url: str, store: Store) -> None:
    async with store.transaction() as tx:
        await outbox.emit(tx, "test.n", "test", "s", {"n": 0})

    received: list[dict] = []

    async def read(after: str | None, want: int) -> None:
        params = {"after": after} if after else {}
        async with httpx.AsyncClient(base_url=live_url) as client, client.stream("GET", "/v1/events/stream", params=params) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    received.append(json.loads(line[5:]))
                    if len(received) >= want:
                        return

    reader = asyncio.create_task(read(None, 3))
    await asyncio.sleep(0.3)
    for n in (1, 2):
        async with store.transaction() as tx:
            await outbox.emit(tx, "test.n", "test", "s", {"n": n})
    await asyncio.wait_for(reader, 10)
    assert [e["data"]["n"] for e in received] == [0, 1, 2]

    resume_from = received[0]["id"]
    received.clear()
    await asyncio.wait_for(read(resume_from, 2), 10)
    assert [e["data"]["n"] for e in received] == [1, 2]


async def _emit(store: Store, count: int) -> None:
    for i in range(count):
        async with store.transaction() as tx:
            await outbox.emit(tx, "test.retained", "test", str(i))
    await outbox.wait_numbered(store)


async def test_retention_deletes_old_events_and_keeps_the_newest(store: Store, clock: ManualClock) -> None:
    await _emit(store, 5)
    clock.advance(10_000)
    await _emit(store, 2)
    assert await outbox.delete_events_before(store, clock.now_ms() - 5_000, batch=3) == 3
    assert await outbox.delete_events_before(store, clock.now_ms() - 5_000, batch=3) == 2
    assert await outbox.delete_events_before(store, clock.now_ms() + 1, batch=100) == 1  # the newest stays
    events, _ = await outbox.read_events(store, 0, 100)
    assert [e["subject"]["id"] for e in events] == ["1"]


async def test_retention_never_deletes_what_a_publisher_has_not_published(store: Store, clock: ManualClock) -> None:
    await _emit(store, 6)
    async with store.transaction() as tx:
        await core_data.lease_cursor(tx, store, "webhook:slow", "token", clock.now_ms(), 30_000)
        await core_data.advance_cursor(tx, "webhook:slow", "token", 2, clock.now_ms())
    clock.advance(10_000)
    assert await outbox.delete_events_before(store, clock.now_ms(), batch=100, publishers=["webhook:slow"]) == 2
    assert await outbox.delete_events_before(store, clock.now_ms(), batch=100, publishers=["webhook:slow", "nats:never"]) == 0
    events, _ = await outbox.read_events(store, 0, 100)
    assert len(events) == 4


async def test_an_alert_is_raised_once_per_open_subject_and_again_once_acknowledged(store: Store) -> None:
    from mainspring.core.alerts import ack_alert, raise_alerts

    async with store.transaction() as tx:
        first = await raise_alerts(tx, "test_alert", "test", [(f"s{i}", "detail") for i in range(3)])
        await raise_alerts(tx, "other_code", "test", [("s3", "detail")])
    await ack_alert(store, first[0])  # s0's alert is no longer open
    async with store.transaction() as tx:
        again = await raise_alerts(tx, "test_alert", "test", [(f"s{i}", "again") for i in range(5)] + [("s4", "twice")])
    async with store.read() as conn:
        rows = (await conn.execute(select(alerts.c.subject_id, alerts.c.detail).where(alerts.c.id.in_(again)))).all()
    # s1 and s2 are open already; s3's open alert has another code; s4 is asked about twice in one call.
    assert sorted(rows) == [("s0", "again"), ("s3", "again"), ("s4", "again")]
