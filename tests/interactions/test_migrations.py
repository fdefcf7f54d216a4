"""interactions_0010 (fair leases) on a store with items in it: they get priority 0 and no owner, are in the new
indexes, and are leased after the upgrade as before."""

from __future__ import annotations

from importlib import resources

import pytest
from sqlalchemy import text

from mainspring.config import Settings
from mainspring.interactions import leasing, service
from mainspring.store import Clock, Store
from mainspring.store.migrate import MIGRATIONS, migrate
from tests.conftest import upgrade_to


async def test_items_queued_before_the_ready_ranks_are_leased_after_the_upgrade(blank_database_url: str, settings: Settings) -> None:
    cfg = settings.interactions
    store = Store(blank_database_url, clock=Clock())
    try:
        await store.run_sync(upgrade_to("interactions_0009"))
        now = store.now_ms()
        async with store.transaction() as tx:
            await tx.execute(text(
                "INSERT INTO interaction_queues (name, lease_ms, error_delay_ms, max_attempts, created_at, updated_at) VALUES ('q', 30000, 0, 5, 0, 0)"
            ))
            for n, (state, due) in enumerate((("queued", now - 2000), ("queued", now - 1000), ("queued", now + 3_600_000), ("completed", None))):
                await tx.execute(text(
                    "INSERT INTO interactions (queue, state, next_processing, attempts, created_at, updated_at, data) "
                    "VALUES ('q', :state, :due, 0, :now, :now, :data)"
                ), {"state": state, "due": due, "now": now, "data": f'{{"n": {n}}}'})
        await migrate(store)
        async with store.read() as conn:
            indexes = {r[0] for r in (await conn.execute(text(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'interactions'" if store.is_postgres
                else "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'interactions'"
            ))).all()}
        assert {"ix_interactions_ready", "ix_interactions_owner_ready", "ix_interactions_due"} <= indexes
        taken = await leasing.lease(store, cfg, "q", "w", 10)
        assert [i["data"]["n"] for i in taken.items] == [0, 1]
        assert [i["priority"] for i in taken.items] == [0, 0]
        counts = (await service.get_queue(store, cfg, "q"))["counts"]
        assert (counts["processing"], counts["scheduled"], counts["completed"]) == (2, 1, 1)
    finally:
        await store.close()


async def test_an_interrupted_index_build_is_built_again(blank_database_url: str, engine: str) -> None:
    """A CONCURRENTLY build that died leaves an invalid index: running the migration again replaces it."""
    if engine == "sqlite":
        pytest.skip("SQLite builds an index in its transaction: nothing is left half-built")
    store = Store(blank_database_url)
    try:
        # interactions_0010 died in its CONCURRENTLY build: the later revisions never ran.
        await store.run_sync(upgrade_to("interactions_0010"))
        async with store.transaction() as tx:
            await tx.execute(text("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'ix_interactions_ready'::regclass"))
            await tx.execute(text("DELETE FROM alembic_version WHERE version_num = 'interactions_0010'"))
            await tx.execute(text("INSERT INTO alembic_version (version_num) VALUES ('interactions_0009')"))
        await migrate(store)
        async with store.read() as conn:
            valid = (await conn.execute(text("SELECT indisvalid FROM pg_index WHERE indexrelid = 'ix_interactions_ready'::regclass"))).scalar_one()
        assert valid is True
    finally:
        await store.close()


async def test_the_fair_lease_the_store_runs_is_the_one_in_interactions_fair_lease_sql(store: Store, engine: str) -> None:
    if engine != "postgres":
        pytest.skip("the function is PostgreSQL's")
    home = resources.files("mainspring.interactions").joinpath("fair_lease.sql").read_text()
    async with store.read() as conn:
        running = (await conn.execute(text("SELECT prosrc FROM pg_proc WHERE proname = 'mainspring_interactions_fair_lease'"))).scalar_one()
    assert running == home.split("$fn$")[1]


def test_no_migration_but_the_first_one_holds_the_fair_lease_text() -> None:
    """One home for the algorithm: interactions_0014 keeps its first text (what a downgrade to it restores); every
    later revision loads ``interactions/fair_lease.sql``."""
    holding = sorted(p.name for p in MIGRATIONS.joinpath("versions").glob("*.py")
                     if "FUNCTION mainspring_interactions_fair_lease(" in p.read_text())
    assert holding == ["interactions_0014_fair_lease_function.py"]
