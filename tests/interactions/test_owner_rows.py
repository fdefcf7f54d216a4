"""The owners' rows of a fair queue (migration interactions_0012, issue 27): each owner's next due time kept with
the writes, the lease reading owners in turn order, and the retention loop deleting the rows that keep nothing."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
from sqlalchemy import text

from mainspring.config import Settings
from mainspring.interactions import leasing, outcomes, service
from mainspring.store import Clock, ManualClock, Store
from mainspring.store.migrate import migrate
from tests.conftest import eventually, upgrade_to
from tests.interactions.conftest import create, lease, put_queue, release


async def dues(store: Store, queue: str = "q") -> dict[str, int | None]:
    async with store.read() as conn:
        rows = (await conn.execute(text("SELECT owner, next_due FROM interaction_owners WHERE queue = :q"), {"q": queue})).all()
    return {r.owner: r.next_due for r in rows}


async def test_creating_an_item_gives_its_owner_the_items_due_time(store: Store, settings: Settings, clock: ManualClock) -> None:
    cfg = settings.interactions
    clock.set(1_000_000)
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True})
    await service.create_many(store, cfg, "q", [{"user": "alice", "due_at": 1_005_000}, {"user": "bob"}])
    await service.create_many(store, cfg, "q", [{"user": "alice"}])
    assert await dues(store) == {"alice": 1_000_000, "bob": 1_000_000}


async def test_a_queue_without_owner_by_keeps_no_owner_rows(store: Store, settings: Settings) -> None:
    await service.create_many(store, settings.interactions, "plain", [{"user": "alice"}])
    assert await dues(store, "plain") == {}


async def test_a_lease_that_takes_an_owners_last_due_item_sets_its_due_time_to_its_next_item(
    store: Store, settings: Settings, clock: ManualClock
) -> None:
    cfg = settings.interactions
    clock.set(1_000_000)
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True})
    await service.create_many(store, cfg, "q", [{"user": "alice"}, {"user": "alice", "due_at": 1_005_000}, {"user": "bob"}])
    assert len((await leasing.lease(store, cfg, "q", "w", 10)).items) == 2
    assert await dues(store) == {"alice": 1_005_000, "bob": None}
    clock.advance(5000)
    [item] = (await leasing.lease(store, cfg, "q", "w", 10)).items
    assert item["user"] == "alice"


async def test_a_retry_gives_its_owner_a_due_time_again(store: Store, settings: Settings, clock: ManualClock) -> None:
    cfg = settings.interactions
    clock.set(1_000_000)
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True, "error_delay_ms": 2000})
    await service.create_many(store, cfg, "q", [{"user": "alice"}])
    [item] = (await leasing.lease(store, cfg, "q", "w", 10)).items
    assert await dues(store) == {"alice": None}
    await leasing.release(store, item["id"], item["lease"]["token"], outcomes.Retry("flaky"))
    assert await dues(store) == {"alice": 1_002_000}


async def test_an_expired_lease_gives_its_owner_a_due_time_again(store: Store, settings: Settings, clock: ManualClock) -> None:
    cfg = settings.interactions
    clock.set(1_000_000)
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True, "lease_ms": 1000, "error_delay_ms": 0})
    await service.create_many(store, cfg, "q", [{"user": "alice"}])
    assert len((await leasing.lease(store, cfg, "q", "w", 10)).items) == 1
    clock.advance(1000)
    [again] = (await leasing.lease(store, cfg, "q", "w", 10)).items
    assert again["user"] == "alice" and again["attempts"] == 2


async def test_setting_owner_by_gives_every_owner_a_row_also_the_empty_one(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.create_many(store, cfg, "q", [{"user": "alice"}, {}])
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True})
    assert set(await dues(store)) == {"alice", ""}
    assert Counter(i["user"] for i in (await leasing.lease(store, cfg, "q", "w", 10)).items) == {"alice": 1, None: 1}


async def test_a_fair_lease_over_many_owners_gives_each_one_item_in_turn(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True})
    await service.create_many(store, cfg, "q", [{"user": f"o{n % 30}"} for n in range(90)])
    for _ in range(3):
        taken = Counter(i["user"] for i in (await leasing.lease(store, cfg, "q", "w", 10)).items)
        assert len(taken) == 10 and set(taken.values()) == {1}
    assert len({i["user"] for _ in range(3) for i in (await leasing.lease(store, cfg, "q", "w", 10)).items}) == 30


async def test_owners_with_fewer_items_than_their_turns_give_the_rest_to_owners_further_on(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True})
    await service.create_many(store, cfg, "q", [{"user": f"small{n}"} for n in range(5)] + [{"user": "big"} for _ in range(20)])
    assert Counter(i["user"] for i in (await leasing.lease(store, cfg, "q", "w", 3)).items).total() == 3
    taken = Counter(i["user"] for i in (await leasing.lease(store, cfg, "q", "w", 10)).items)
    assert taken.total() == 10 and taken["big"] >= 7


async def test_the_retention_loop_deletes_owner_rows_with_nothing_queued_and_keeps_the_others(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True})
    await service.create_many(store, cfg, "q", [{"user": "done"}, {"user": "processing"}, {"user": "processing"}, {"user": "later", "due_at": 4_000_000_000_000}])
    taken = (await leasing.lease(store, cfg, "q", "w", 10)).items
    await leasing.release_many(store, "q", [(int(i["id"]), i["lease"]["token"], outcomes.Complete(None)) for i in taken if i["user"] == "done"])
    assert set(await dues(store)) == {"done", "processing", "later"}
    assert await service.prune_idle_owners(store, 100) == 2
    assert set(await dues(store)) == {"later"}


async def test_the_servers_retention_loop_deletes_the_rows_of_owners_done(client: httpx.AsyncClient, store: Store) -> None:
    await put_queue(client, owner_by="user", fair=True)
    for user in ("alice", "bob"):
        await create(client, user=user)
    for item in await lease(client, max=10):
        await release(client, item, {"complete": {}})

    async def gone() -> bool:
        return await dues(store) == {}

    await eventually(gone, what="the owner rows deleted by the retention loop")


async def test_an_owner_with_items_queued_keeps_its_row(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True})
    await service.create_many(store, cfg, "q", [{"user": "alice"}, {"user": "bob"}])
    assert await service.prune_idle_owners(store, 100) == 0
    assert set(await dues(store)) == {"alice", "bob"}


async def test_an_owners_rate_window_in_effect_keeps_its_row(store: Store, settings: Settings, clock: ManualClock) -> None:
    cfg = settings.interactions
    clock.set(10_000_000)
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "per_owner": {"rate_limit": {"count": 1, "per_ms": 1000}}})
    await service.create_many(store, cfg, "q", [{"user": "alice"}, {"user": "alice"}])
    [item] = (await leasing.lease(store, cfg, "q", "w", 10)).items
    await leasing.release(store, item["id"], item["lease"]["token"], outcomes.Fail("no"))
    async with store.transaction() as tx:
        await tx.execute(text("DELETE FROM interactions WHERE queue = 'q' AND state = 'queued'"))
    assert await service.prune_idle_owners(store, 100) == 0
    assert (await leasing.lease(store, cfg, "q", "w", 10)).items == []
    clock.advance(62_000)
    assert await service.prune_idle_owners(store, 100) == 1


async def test_an_owner_pruned_that_comes_back_gets_its_share_not_a_burst(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"owner_by": "user", "fair": True})
    await service.create_many(store, cfg, "q", [{"user": "back"}])
    await leasing.lease(store, cfg, "q", "w", 1)
    await service.create_many(store, cfg, "q", [{"user": "steady"} for _ in range(60)])
    for _ in range(40):
        await leasing.lease(store, cfg, "q", "w", 1)
    assert await service.prune_idle_owners(store, 100) == 1
    await service.create_many(store, cfg, "q", [{"user": "back"} for _ in range(20)])
    taken: Counter[str] = Counter()
    for _ in range(10):
        taken.update(i["user"] for i in (await leasing.lease(store, cfg, "q", "w", 1)).items)
    assert taken == {"steady": 5, "back": 5}


async def test_owners_queued_before_the_upgrade_get_their_due_times(blank_database_url: str, settings: Settings) -> None:
    store = Store(blank_database_url, clock=Clock())
    try:
        await store.run_sync(upgrade_to("interactions_0011"))
        now = store.now_ms()
        async with store.transaction() as tx:
            await tx.execute(text(
                "INSERT INTO interaction_queues (name, lease_ms, error_delay_ms, max_attempts, created_at, updated_at, owner_by, fair) "
                "VALUES ('q', 30000, 0, 5, 0, 0, 'user', true)"
            ))
            for owner, due in (("alice", now - 2000), ("alice", now - 1000), ("bob", now + 60_000)):
                await tx.execute(text(
                    "INSERT INTO interactions (queue, \"user\", owner, state, next_processing, attempts, created_at, updated_at) "
                    "VALUES ('q', :owner, :owner, 'queued', :due, 0, :now, :now)"
                ), {"owner": owner, "due": due, "now": now})
        await migrate(store)
        assert await dues(store) == {"alice": now - 2000, "bob": now + 60_000}
        assert [i["user"] for i in (await leasing.lease(store, settings.interactions, "q", "w", 10)).items] == ["alice", "alice"]
    finally:
        await store.close()



async def test_postgresql_plans_a_read_by_owner_as_narrow_whatever_owners_its_sample_saw(store: Store) -> None:
    if not store.is_postgres:
        pytest.skip("SQLite keeps no per-column statistics settings")
    async with store.read() as conn:
        options = (await conn.execute(text(
            "SELECT attoptions FROM pg_attribute WHERE attrelid = 'interactions'::regclass AND attname = 'owner'"
        ))).scalar_one()
    assert "n_distinct=-0.05" in options


async def test_an_item_due_this_very_millisecond_counts_as_ready_among_the_busiest_owners(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"owner_by": "user"})
    await service.create(store, cfg, "q", {"user": "alice", "data": 1})
    assert await service.busiest_owners(store, "q") == [{"owner": "alice", "ready": 1, "processing": 0}]
