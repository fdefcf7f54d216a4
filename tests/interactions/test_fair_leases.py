"""Priorities that age, limits per owner, fair shares (API.md §3, issue 27): over HTTP and through the service."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from mainspring.app import App, AppError
from mainspring.client.interactions import AsyncInteractionsClient
from mainspring.config import Settings
from mainspring.interactions import leasing, outcomes, service
from mainspring.interactions.models import Interaction
from mainspring.interactions.worker import Worker
from mainspring.producer import producer
from mainspring.store import ManualClock, Store
from tests.interactions.conftest import create, get, lease, put_queue, release


def owners_of(items: list[dict[str, Any]]) -> list[str | None]:
    return [i["user"] for i in items]


# --- priorities ---------------------------------------------------------------------------------------------


async def test_an_interaction_has_priority_zero_unless_given_and_shows_it(client: httpx.AsyncClient) -> None:
    plain = await create(client)
    urgent = await create(client, priority=1000)
    assert plain["priority"] == 0 and urgent["priority"] == 1000
    assert (await get(client, urgent["id"]))["priority"] == 1000


@pytest.mark.parametrize("bad", [1001, -1001, "high", 1.5, True, None])
async def test_a_priority_outside_minus_1000_to_1000_is_422_and_creates_nothing(client: httpx.AsyncClient, bad: Any) -> None:
    reply = await client.post("/v1/queues/q/interactions", json={"data": 1, "priority": bad})
    assert reply.status_code == 422 and reply.json()["code"] == "invalid_request", reply.text
    assert (await client.get("/v1/queues/q")).json()["counts"]["ready"] == 0


async def test_a_lease_takes_the_highest_priority_first_then_the_earliest_due_then_the_id(
    client: httpx.AsyncClient, clock: ManualClock
) -> None:
    low = await create(client, priority=-5)
    clock.advance(10)
    later = await create(client, priority=7)
    clock.advance(10)
    same_due_a = await create(client, process_in_ms=0, priority=7)
    same_due_b = await create(client, process_in_ms=0, priority=7)
    earlier = await create(client, priority=7, process_at="1970-01-01T00:00:00Z")
    top = await create(client, priority=8)
    taken = await lease(client, max=10)
    assert [i["id"] for i in taken] == [top["id"], earlier["id"], later["id"], same_due_a["id"], same_due_b["id"], low["id"]]


async def test_a_lease_of_two_takes_the_two_highest_not_the_two_oldest(client: httpx.AsyncClient, clock: ManualClock) -> None:
    for _ in range(3):
        await create(client)
        clock.advance(5)
    high = [await create(client, priority=3) for _ in range(2)]
    assert [i["id"] for i in await lease(client, max=2)] == [h["id"] for h in high]


async def test_with_aging_an_item_that_waited_passes_newer_higher_ones(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, priority_aging_ms=1000)
    old = await create(client, priority=0)
    clock.advance(5_500)  # effective priority 5.5
    newer = await create(client, priority=5)
    urgent = await create(client, priority=6)
    taken = await lease(client, max=3)
    assert [i["id"] for i in taken] == [urgent["id"], old["id"], newer["id"]]


async def test_without_aging_a_low_priority_item_waits_behind_newer_higher_ones(client: httpx.AsyncClient, clock: ManualClock) -> None:
    old = await create(client, priority=0)
    clock.advance(3_600_000)
    newer = await create(client, priority=1)
    assert [i["id"] for i in await lease(client, max=2)] == [newer["id"], old["id"]]


# --- settings -----------------------------------------------------------------------------------------------


async def test_owner_settings_are_stored_and_shown_by_get_queue(client: httpx.AsyncClient) -> None:
    fresh = (await client.get("/v1/queues/fresh")).json()
    assert (fresh["priority_aging_ms"], fresh["owner_by"], fresh["fair"], fresh["weights"]) == (None, None, False, {})
    assert fresh["per_owner"] == {"concurrency": None, "rate_limit": None}
    body = await put_queue(
        client, "fresh", priority_aging_ms=60_000, owner_by="source", per_owner={"concurrency": 3, "rate_limit": {"count": 5, "per_ms": 1000}},
        fair=True, weights={"big": 4},
    )
    expected = {"priority_aging_ms": 60_000, "owner_by": "source", "per_owner": {"concurrency": 3, "rate_limit": {"count": 5, "per_ms": 1000}},
                "fair": True, "weights": {"big": 4}}
    assert {k: body[k] for k in expected} == expected
    again = (await client.get("/v1/queues/fresh")).json()
    assert {k: again[k] for k in expected} == expected


@pytest.mark.parametrize(("bad", "says"), [
    ({"fair": True}, "owner_by"),
    ({"per_owner": {"concurrency": 2}}, "owner_by"),
    ({"weights": {"a": 2}}, "owner_by"),
    ({"owner_by": "user", "weights": {"a": 0}}, "greater than or equal to 1"),
    ({"owner_by": "user", "weights": {"a": 1.5}}, ""),
    ({"owner_by": "team"}, "owner_by"),
    ({"owner_by": "user", "per_owner": {"concurrency": 0}}, ""),
    ({"owner_by": "user", "per_owner": {"rate_limit": {"count": 1}}}, "per_ms"),
    ({"owner_by": "user", "per_owner": {"limit": 1}}, "limit"),
    ({"priority_aging_ms": 0}, "priority_aging_ms"),
])
async def test_bad_owner_settings_are_422_naming_what_is_wrong_and_change_nothing(
    client: httpx.AsyncClient, bad: dict[str, Any], says: str
) -> None:
    reply = await client.put("/v1/queues/strict", json=bad)
    assert reply.status_code == 422 and reply.json()["code"] == "invalid_request", reply.text
    assert says in reply.text
    after = (await client.get("/v1/queues/strict")).json()
    assert (after["owner_by"], after["fair"], after["priority_aging_ms"]) == (None, False, None)


# --- limits per owner ---------------------------------------------------------------------------------------


async def test_per_owner_concurrency_holds_for_each_owner_separately(client: httpx.AsyncClient) -> None:
    await put_queue(client, owner_by="user", per_owner={"concurrency": 2})
    for user in ("alice", "bob"):
        for _ in range(5):
            await create(client, user=user)
    taken = await lease(client, max=10)
    assert Counter(owners_of(taken)) == {"alice": 2, "bob": 2}
    assert await lease(client, max=10) == []
    alice = next(i for i in taken if i["user"] == "alice")
    await release(client, alice, {"complete": {}})
    assert owners_of(await lease(client, max=10)) == ["alice"]


async def test_per_owner_rate_limit_holds_for_each_owner_in_each_window(client: httpx.AsyncClient, clock: ManualClock) -> None:
    clock.set(1_000_000)
    await put_queue(client, owner_by="user", per_owner={"rate_limit": {"count": 2, "per_ms": 1000}})
    for user in ("alice", "bob"):
        for _ in range(5):
            await create(client, user=user)
    first = await lease(client, max=10)
    assert Counter(owners_of(first)) == {"alice": 2, "bob": 2}
    for item in first:
        await release(client, item, {"complete": {}})
    assert await lease(client, max=10) == [], "the window's count is spent, whatever was released"
    clock.advance(1000)
    assert Counter(owners_of(await lease(client, max=10))) == {"alice": 2, "bob": 2}


async def test_items_without_the_owner_field_share_the_owner_empty_string(client: httpx.AsyncClient) -> None:
    await put_queue(client, owner_by="user", per_owner={"concurrency": 1})
    for _ in range(3):
        await create(client)
    await create(client, user="alice")
    assert Counter(owners_of(await lease(client, max=10))) == {"alice": 1, None: 1}


async def test_the_queue_limits_still_hold_beside_the_owners(client: httpx.AsyncClient) -> None:
    await put_queue(client, owner_by="user", per_owner={"concurrency": 5}, concurrency=3)
    for user in ("alice", "bob"):
        for _ in range(5):
            await create(client, user=user)
    assert len(await lease(client, max=10)) == 3
    assert await lease(client, max=10) == []


async def test_changing_owner_by_makes_waiting_items_owned_by_the_new_field(client: httpx.AsyncClient) -> None:
    for source in ("a", "a", "a", "b", "b"):
        await create(client, source=source, user="same")
    await put_queue(client, owner_by="user", per_owner={"concurrency": 1})
    await put_queue(client, owner_by="source", per_owner={"concurrency": 1})
    assert sorted(i["source"] for i in await lease(client, max=10)) == ["a", "b"]


async def test_owners_keep_the_priority_order_within_each_owner(client: httpx.AsyncClient) -> None:
    await put_queue(client, owner_by="user", per_owner={"concurrency": 1})
    await create(client, user="alice", priority=1)
    top = await create(client, user="alice", priority=9)
    await create(client, user="bob")
    bob_top = await create(client, user="bob", priority=2)
    assert {i["id"] for i in await lease(client, max=10)} == {top["id"], bob_top["id"]}


# --- fair shares --------------------------------------------------------------------------------------------


async def test_with_fair_a_flooding_owner_does_not_delay_the_others(client: httpx.AsyncClient) -> None:
    await put_queue(client, owner_by="user", fair=True)
    await client.post("/v1/queues/q/interactions/bulk", json={"interactions": [{"user": "flood"} for _ in range(200)]})
    small = [await create(client, user=user) for user in ("bob", "carol") for _ in range(2)]
    first = await lease(client, max=6)
    assert Counter(owners_of(first)) == {"flood": 2, "bob": 2, "carol": 2}
    assert {i["id"] for i in small} <= {i["id"] for i in first}


async def test_without_fair_the_oldest_owner_goes_first(client: httpx.AsyncClient) -> None:
    await put_queue(client, owner_by="user")
    await client.post("/v1/queues/q/interactions/bulk", json={"interactions": [{"user": "flood"} for _ in range(20)]})
    await create(client, user="bob")
    assert set(owners_of(await lease(client, max=10))) == {"flood"}


async def test_weighted_shares_follow_the_weights_lease_after_lease(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True, "weights": {"big": 3}})
    await service.create_many(store, cfg, "q", [{"user": u} for u in ("big", "small") for _ in range(150)])
    taken: Counter[str] = Counter()
    for _ in range(100):
        [item] = (await leasing.lease(store, cfg, "q", "w", 1)).items
        taken[item["user"]] += 1
    assert taken == {"big": 75, "small": 25}


async def test_an_owner_that_comes_back_gets_its_share_not_a_burst(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True})
    await service.create_many(store, cfg, "q", [{"user": "steady"} for _ in range(100)])
    for _ in range(40):
        await leasing.lease(store, cfg, "q", "w", 1)
    await service.create_many(store, cfg, "q", [{"user": "back"} for _ in range(20)])
    taken: Counter[str] = Counter()
    for _ in range(10):
        taken.update(i["user"] for i in (await leasing.lease(store, cfg, "q", "w", 1)).items)
    assert taken == {"steady": 5, "back": 5}


async def test_an_owner_at_its_limit_gives_its_turns_to_the_others(client: httpx.AsyncClient) -> None:
    await put_queue(client, owner_by="user", fair=True, per_owner={"concurrency": 1})
    for user in ("alice", "bob", "carol"):
        for _ in range(3):
            await create(client, user=user)
    assert Counter(owners_of(await lease(client, max=10))) == {"alice": 1, "bob": 1, "carol": 1}
    assert await lease(client, max=10) == []


async def test_an_owner_at_its_limit_banks_no_turns_so_freed_it_takes_its_share_not_a_burst(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True, "per_owner": {"concurrency": 2}})
    await service.create_many(store, cfg, "q", [{"user": "zoe"} for _ in range(4)])
    held = (await leasing.lease(store, cfg, "q", "w", 2)).items
    await service.create_many(store, cfg, "q", [{"user": u} for u in ("ann", "bob") for _ in range(10)])
    for _ in range(5):  # zoe at her limit: ann and bob take the turns
        taken = (await leasing.lease(store, cfg, "q", "w", 2)).items
        assert sorted(owners_of(taken)) == ["ann", "bob"]
        await leasing.release_many(store, "q", [(int(i["id"]), i["lease"]["token"], outcomes.Complete(None)) for i in taken])
    await leasing.release_many(store, "q", [(int(i["id"]), i["lease"]["token"], outcomes.Complete(None)) for i in held])
    assert owners_of((await leasing.lease(store, cfg, "q", "w", 3)).items).count("zoe") == 1


async def test_a_lease_released_for_retry_comes_back_with_its_owner(client: httpx.AsyncClient) -> None:
    await put_queue(client, owner_by="user", fair=True, per_owner={"concurrency": 1}, error_delay_ms=0)
    await create(client, user="alice")
    [item] = await lease(client)
    await release(client, item, {"retry": {"error": "flaky"}})
    [again] = await lease(client)
    assert again["id"] == item["id"] and again["user"] == "alice"


async def test_an_expired_lease_frees_its_owners_slot(store: Store, settings: Settings, clock: ManualClock) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "per_owner": {"concurrency": 1}, "lease_ms": 1000, "error_delay_ms": 0})
    await service.create_many(store, cfg, "q", [{"user": "alice"}, {"user": "alice"}])
    assert len((await leasing.lease(store, cfg, "q", "w", 5)).items) == 1
    assert (await leasing.lease(store, cfg, "q", "w", 5)).items == []
    clock.advance(1000)
    assert len((await leasing.lease(store, cfg, "q", "w", 5)).items) == 1


async def test_a_release_through_the_service_frees_the_owners_slot(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"owner_by": "channel", "per_owner": {"concurrency": 1}})
    await service.create_many(store, cfg, "q", [{"channel": "c1"}, {"channel": "c1"}, {"channel": "c2"}])
    held = (await leasing.lease(store, cfg, "q", "w", 5)).items
    assert sorted(i["channel"] for i in held) == ["c1", "c2"]
    c1 = next(i for i in held if i["channel"] == "c1")
    await leasing.release(store, c1["id"], c1["lease"]["token"], outcomes.Complete(None))
    [next_c1] = (await leasing.lease(store, cfg, "q", "w", 5)).items
    assert next_c1["channel"] == "c1"


# --- the worker, the producer, the client -------------------------------------------------------------------


async def test_app_queue_owner_options_set_the_queue_and_the_worker_keeps_each_owner_within_its_limit(
    store: Store, settings: Settings
) -> None:
    cfg = settings.interactions
    running: Counter[str] = Counter()
    most: Counter[str] = Counter()
    done: list[str] = []

    async def handle(item: Interaction) -> None:
        owner = item.user or ""
        running[owner] += 1
        most[owner] = max(most[owner], running[owner])
        await asyncio.sleep(0.02)
        running[owner] -= 1
        done.append(item.id)

    app = App()
    app.queue("owned", concurrency=20, owner_by="user", per_owner={"concurrency": 2}, fair=True, weights={"a": 2})(handle)
    worker = Worker(store, app, cfg, poll_ms=50)
    await worker.start()  # creates the queue with those settings
    try:
        await service.create_many(store, cfg, "owned", [{"user": u} for u in ("a", "b", "c") for _ in range(6)])
        for _ in range(400):
            if len(done) == 18:
                break
            await asyncio.sleep(0.025)
    finally:
        await worker.stop()
    assert len(done) == 18
    assert max(most.values()) <= 2 and set(most) == {"a", "b", "c"}
    queue = await service.get_queue(store, cfg, "owned")
    assert (queue["owner_by"], queue["per_owner"]["concurrency"], queue["fair"], queue["weights"]) == ("user", 2, True, {"a": 2})


def test_app_queue_refuses_owner_options_without_owner_by() -> None:
    with pytest.raises(AppError, match="owner_by"):
        App().queue("q", fair=True)(lambda item: None)
    with pytest.raises(AppError, match="weights"):
        App().queue("q", owner_by="user", weights={"a": 0})(lambda item: None)


async def test_the_producer_creates_with_a_priority(database_url: str, tmp_path: Path, store: Store, settings: Settings) -> None:
    async with producer(database=database_url, data_dir=tmp_path) as mainspring:
        await mainspring.create("p", data=1)
        urgent = await mainspring.create("p", data=2, priority=5)
    assert urgent["priority"] == 5
    [first, _] = (await leasing.lease(store, settings.interactions, "p", "w", 2)).items
    assert first["id"] == urgent["id"]


async def test_the_client_sets_owner_settings_and_creates_with_a_priority(app: Any) -> None:
    ms = AsyncInteractionsClient("http://mainspring.test", transport=httpx.ASGITransport(app=app))
    async with ms:
        queue = await ms.put_queue("c", owner_by="channel", per_owner={"concurrency": 1}, fair=True, weights={"x": 3},
                                                priority_aging_ms=1000)
        assert (queue["owner_by"], queue["per_owner"], queue["weights"]) == ("channel", {"concurrency": 1, "rate_limit": None}, {"x": 3})
        item = await ms.create("c", {"n": 1}, channel="x", priority=-3)
        assert item["priority"] == -3
