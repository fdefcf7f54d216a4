"""Periodic work: one interaction per cron tick, exactly once across servers, caught up after an outage
no longer than the schedule's catch-up window. Time moves on the injectable clock."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mainspring.api import create_app
from mainspring.app import App
from mainspring.config import Settings
from mainspring.core.errors import InvalidRequest
from mainspring.interactions import data, periodic, service
from mainspring.interactions.cron import CRON_PATTERN
from mainspring.interactions.settings import InteractionsSettings
from mainspring.store import ManualClock, Store
from tests.conftest import eventually

CFG = InteractionsSettings()
MINUTE = 60_000


async def _ticks(store: Store, name: str) -> list[str]:
    found, _ = await service.list_items(store, "reports", {}, 1000, None)
    return sorted(i["message_id"] for i in found if i["message_id"].startswith(f"periodic:{name}:"))


async def _ticks_once(store: Store, name: str, n: int) -> list[str] | None:
    ticks = await _ticks(store, name)
    assert len(ticks) <= n, ticks
    return ticks if len(ticks) == n else None


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_800_000_000_000 - 1_800_000_000_000 % (60 * MINUTE))  # on the hour


async def test_a_schedule_creates_one_interaction_per_tick(client: httpx.AsyncClient, store: Store, clock: ManualClock) -> None:
    put = await client.put("/v1/periodic/rollup", json={"cron": "*/5 * * * *", "queue": "reports", "data": {"kind": "rollup"}})
    assert put.status_code == 200, put.text
    first = put.json()["next_tick"]
    clock.advance(5 * MINUTE)
    await periodic.fire_due_schedules(store, CFG)
    clock.advance(5 * MINUTE)
    await periodic.fire_due_schedules(store, CFG)
    # The server's own periodic loop is woken by the clock too and may be firing the schedule right now: a
    # call that meets it skips the locked schedule and leaves the ticks to it (see the next test), so the
    # ticks are awaited, not expected from our own calls.
    ticks = await eventually(lambda: _ticks_once(store, "rollup", 2), what="two ticks")
    await periodic.fire_due_schedules(store, CFG)  # nothing new is due
    assert await _ticks(store, "rollup") == ticks
    item = (await service.list_items(store, "reports", {"message_id": ticks[0]}, 1, None))[0][0]
    assert item["data"] == {"kind": "rollup"} and item["status"] == "ready"
    assert (await client.get("/v1/periodic/rollup")).json()["next_tick"] > first


async def test_two_servers_firing_the_same_tick_create_it_once(store: Store, database_url: str, clock: ManualClock) -> None:
    await periodic.put_schedule(store, "rollup", cron="* * * * *", queue="reports")
    others = [Store(database_url, clock=clock) for _ in range(3)]
    try:
        clock.advance(MINUTE)
        await asyncio.gather(*(periodic.fire_due_schedules(s, CFG) for s in [store, *others]))
    finally:
        for other in others:
            await other.close()
    assert len(await _ticks(store, "rollup")) == 1


async def test_a_firing_that_meets_another_leaves_the_ticks_to_it_and_none_is_lost(
        store: Store, database_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite has one writer: two firings never overlap")
    await periodic.put_schedule(store, "rollup", cron="*/5 * * * *", queue="reports")
    other = Store(database_url, clock=clock)  # another server (or this server's own loop)
    inside, go_on = asyncio.Event(), asyncio.Event()
    set_next_tick = data.set_next_tick

    async def held(tx: Any, name: str, tick: int) -> None:
        if tx.store is other:  # the other firing stops with its tick written and the schedule locked
            inside.set()
            await go_on.wait()
        await set_next_tick(tx, name, tick)

    monkeypatch.setattr(data, "set_next_tick", held)
    try:
        clock.advance(5 * MINUTE)
        holder = asyncio.create_task(periodic.fire_due_schedules(other, CFG))
        await inside.wait()
        clock.advance(5 * MINUTE)
        # This firing meets the one in progress: it skips the locked schedule and creates nothing itself.
        await periodic.fire_due_schedules(store, CFG)
        assert await _ticks(store, "rollup") == []
        go_on.set()
        # The holder fired the tick due at its start and answers that the next one is due now: its loop
        # comes back at once, so the tick that fell due while it held the schedule is not lost.
        assert await holder == clock.now_ms()
        assert len(await _ticks(store, "rollup")) == 1
        await periodic.fire_due_schedules(store, CFG)
        assert len(await _ticks(store, "rollup")) == 2
    finally:
        go_on.set()
        await other.close()


async def test_ticks_missed_within_the_catch_up_window_are_created_older_ones_skipped(store: Store, clock: ManualClock) -> None:
    await periodic.put_schedule(store, "hourly", cron="0 * * * *", queue="reports", catch_up_ms=3 * 60 * MINUTE)
    clock.advance(2 * 60 * MINUTE)  # two ticks missed: both within three hours
    await periodic.fire_due_schedules(store, CFG)
    assert len(await _ticks(store, "hourly")) == 2
    clock.advance(10 * 60 * MINUTE)  # ten more missed: only those at most three hours old are made
    await periodic.fire_due_schedules(store, CFG)
    later = await _ticks(store, "hourly")
    assert len(later) == 2 + 4
    assert min(int(t.rsplit(":", 1)[1]) for t in later[2:]) == clock.now_ms() - 3 * 60 * MINUTE


async def test_a_bad_cron_expression_or_time_zone_is_refused(client: httpx.AsyncClient) -> None:
    for body in ({"cron": "61 * * * *", "queue": "reports"}, {"cron": "* * * * *", "queue": "reports", "timezone": "Mars/Base"}):
        answer = await client.put("/v1/periodic/bad", json=body)
        assert answer.status_code == 422 and answer.json()["code"] == "invalid_request", answer.text
    assert (await client.get("/v1/periodic/bad")).json()["code"] == "periodic_not_found"
    with pytest.raises(InvalidRequest):
        App().periodic("not cron", queue="reports")


async def test_a_deleted_schedule_creates_nothing_more(client: httpx.AsyncClient, store: Store, clock: ManualClock) -> None:
    await client.put("/v1/periodic/rollup", json={"cron": "* * * * *", "queue": "reports"})
    assert (await client.delete("/v1/periodic/rollup")).status_code == 204
    clock.advance(5 * MINUTE)
    await periodic.fire_due_schedules(store, CFG)
    assert await _ticks(store, "rollup") == []
    assert (await client.delete("/v1/periodic/rollup")).status_code == 404


async def test_an_app_schedule_is_stored_at_start_and_its_handler_runs_each_tick(
    settings: Settings, store: Store, clock: ManualClock
) -> None:
    handled: list[Any] = []
    app_code = App()

    @app_code.periodic("*/10 * * * *", queue="reports", data={"from": "app"})
    async def report(item: Any) -> None:
        handled.append(item.data)

    server = create_app(settings, store=store, registry=app_code)
    async with server.router.lifespan_context(server):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=server), base_url="http://t") as client:
            listed = (await client.get("/v1/periodic")).json()["periodic"]
            assert [(s["name"], s["source"], s["queue"]) for s in listed] == [("report", "app", "reports")]
            clock.advance(10 * MINUTE)  # wakes the periodic loop, then the worker

            async def ran() -> bool:
                return bool(handled)

            await eventually(ran, within_s=10, what="the handler of the tick's interaction")
    assert handled == [{"from": "app"}]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.from_regex(CRON_PATTERN, fullmatch=True))
def test_every_cron_expression_the_described_pattern_allows_is_one_the_scheduler_follows(cron: str) -> None:
    # /openapi.json shows the pattern: an expression it allows must never be refused (schemathesis sends them).
    periodic.validate(cron, "UTC")
    assert periodic.next_tick_after(cron, "UTC", 1_764_410_000_000) > 1_764_410_000_000


async def test_a_cron_expression_outside_the_pattern_is_422_though_cronsim_might_read_it(client: httpx.AsyncClient) -> None:
    # Reversed ranges, 30 February, double spaces, six fields: what the description does not allow is refused.
    for cron in ("5-3 * * * *", "0 0 30 2 *", "0  0 * * *", "* * * * * *", "@hourly", "0 0 L * *"):
        answer = await client.put("/v1/periodic/outside", json={"cron": cron, "queue": "reports"})
        assert answer.status_code == 422 and answer.json()["code"] == "invalid_request", cron
    for cron in ("0 9-17 * * 1-5", "*/15 0-23/2 1,15 JAN,7 MON", "59 23 31 */2 7", "0 0 29 2 *"):
        answer = await client.put("/v1/periodic/inside", json={"cron": cron, "queue": "reports"})
        assert answer.status_code == 200, (cron, answer.text)
