"""The token is the fence: only a processing item holds one (PostgreSQL's check constraint, migration
interactions_0018), so a release that finds its rows by id and token completes exactly what its leases hold."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from mainspring.config import Settings
from mainspring.interactions import leasing, service
from mainspring.interactions.outcomes import Complete
from mainspring.store import ManualClock, Store
from mainspring.store.migrate import migrate
from tests.conftest import upgrade_to


async def test_the_database_refuses_a_lease_token_on_an_item_that_is_not_processing(store: Store, settings: Settings, engine: str) -> None:
    if engine != "postgres":
        pytest.skip("SQLite releases under its one writer's state check; the constraint is PostgreSQL's")
    created, _ = await service.create(store, settings.interactions, "q", {"data": {"n": 1}})
    with pytest.raises(IntegrityError, match="ck_interactions_lease_token_only_when_processing"):
        async with store.transaction() as tx:
            await tx.execute(text("UPDATE interactions SET lease_token = 'stale' WHERE id = :id"), {"id": int(created["id"])})
    leased = await leasing.lease(store, settings.interactions, "q", "w", 1)
    with pytest.raises(IntegrityError, match="ck_interactions_lease_token_only_when_processing"):
        async with store.transaction() as tx:
            await tx.execute(text("UPDATE interactions SET state = 'queued' WHERE id = :id"), {"id": int(leased.items[0]["id"])})


async def test_a_batch_release_completes_only_the_items_its_tokens_still_hold(store: Store, settings: Settings) -> None:
    cfg = settings.interactions
    await service.create_many(store, cfg, "q", [{"data": {"n": n}} for n in range(4)])
    leased = await leasing.lease(store, cfg, "q", "w", 4)
    first, second, third, fourth = leased.items
    await service.cancel(store, third["id"])
    released = await leasing.release_many(store, "q", [
        (int(first["id"]), first["lease"]["token"], Complete(1)),
        (int(second["id"]), "not-" + second["lease"]["token"], Complete(2)),
        (int(third["id"]), third["lease"]["token"], Complete(3)),
        (int(fourth["id"]), fourth["lease"]["token"], Complete(4)),
    ])
    assert released == [True, False, False, True]
    states = {i["id"]: (await service.read(store, i["id"]))["status"] for i in leased.items}
    assert states == {first["id"]: "completed", second["id"]: "processing", third["id"]: "cancelled", fourth["id"]: "completed"}


async def test_a_batch_release_of_an_expired_lease_completes_nothing_even_before_a_lease_sweeps_it(
    store: Store, settings: Settings, clock: ManualClock
) -> None:
    # An expired lease keeps its token until a lease sweeps it, so the token alone does not fence it: the
    # one-statement completion checks the expiry too.
    cfg = settings.interactions
    await service.create_many(store, cfg, "q", [{"data": {"n": n}} for n in range(2)])
    (expired,) = (await leasing.lease(store, cfg, "q", "w", 1, lease_ms=1_000)).items
    (held,) = (await leasing.lease(store, cfg, "q", "w", 1, lease_ms=60_000)).items
    clock.advance(2_000)
    released = await leasing.release_many(store, "q", [
        (int(expired["id"]), expired["lease"]["token"], Complete(1)),
        (int(held["id"]), held["lease"]["token"], Complete(2)),
    ])
    assert released == [False, True]
    await leasing.lease(store, cfg, "q", "w", 1)
    swept = await service.read(store, expired["id"])
    assert swept["status"] in ("scheduled", "ready") and swept["error"] == leasing.LEASE_EXPIRED
    assert (await service.read(store, held["id"]))["status"] == "completed"


async def test_a_store_whose_finished_items_kept_their_tokens_upgrades_with_them_cleared(blank_database_url: str, engine: str) -> None:
    if engine != "postgres":
        pytest.skip("the constraint is PostgreSQL's")
    store = Store(blank_database_url)
    try:
        await store.run_sync(upgrade_to("interactions_0017"))
        async with store.transaction() as tx:
            for state, token in (("completed", "left-behind"), ("processing", "held"), ("queued", None)):
                await tx.execute(text(
                    "INSERT INTO interactions (queue, state, lease_token, lease_expires_at, next_processing, attempts, created_at, updated_at) "
                    "VALUES ('q', :state, :token, :expires, 0, 1, 0, 0)"
                ), {"state": state, "token": token, "expires": 10**13 if token else None})
        await migrate(store)
        async with store.read() as conn:
            rows = (await conn.execute(text("SELECT state, lease_token FROM interactions ORDER BY id"))).all()
            valid = (await conn.execute(text(
                "SELECT convalidated FROM pg_constraint WHERE conname = 'ck_interactions_lease_token_only_when_processing'"))).scalar_one()
        assert [tuple(r) for r in rows] == [("completed", None), ("processing", "held"), ("queued", None)]
        assert valid is True
    finally:
        await store.close()


async def test_outcomes_sent_with_the_next_lease_complete_only_the_items_their_tokens_still_hold(
    store: Store, settings: Settings, clock: ManualClock, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``release_and_lease`` (a busy worker's outcomes with its next lease: one statement on PostgreSQL, one
    transaction on SQLite) fences each completion as a release alone does: a wrong token, a cancelled item and an
    expired lease change nothing; then it leases what is due."""
    from mainspring.interactions import data

    combined = data.complete_then_take_alone
    calls: list[int] = []

    async def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return await combined(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(data, "complete_then_take_alone", counted)
    cfg = settings.interactions
    await service.create_many(store, cfg, "q", [{"data": {"n": n}} for n in range(4)])
    (expired,) = (await leasing.lease(store, cfg, "q", "w", 1, lease_ms=1_000)).items
    first, second, third = (await leasing.lease(store, cfg, "q", "w", 3, lease_ms=60_000)).items
    await service.cancel(store, third["id"])
    later = [(await service.create(store, cfg, "q", {"data": {"n": n}}))[0]["id"] for n in (4, 5)]
    clock.advance(2_000)
    held, leased = await leasing.release_and_lease(store, cfg, "q", "w", [
        (int(first["id"]), first["lease"]["token"], Complete(1)),
        (int(second["id"]), "not-" + second["lease"]["token"], Complete(2)),
        (int(third["id"]), third["lease"]["token"], Complete(3)),
        (int(expired["id"]), expired["lease"]["token"], Complete(0)),
    ], 10)
    assert held == [True, False, False, False]
    assert calls == ([1] if engine == "postgres" else [])
    states = {i["id"]: (await service.read(store, i["id"]))["status"] for i in (first, second, third)}
    assert states == {first["id"]: "completed", second["id"]: "processing", third["id"]: "cancelled"}
    assert (await service.read(store, first["id"]))["result"] == 1
    # The lease took what was due, and swept the expired lease into a retry (on PostgreSQL the lease the statement
    # handed over to: a sweep needs the whole transaction).
    assert {i["id"] for i in leased.items} == set(later)
    swept = await service.read(store, expired["id"])
    assert swept["status"] == "scheduled" and swept["error"] == leasing.LEASE_EXPIRED
