"""Events written per minute and type (issue 26): kept with the writes (migration core_0008, ``store.counts``)
for the dashboard's throughput chart; the chart's own numbers against a count of the events are in
tests/ui/test_pages.py."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from mainspring.config import Settings
from mainspring.core import outbox
from mainspring.core.publishers import prune_published_events
from mainspring.core.runtime import Context
from mainspring.core.tables import EVENT_COUNTS_KEPT_MS
from mainspring.store import ManualClock, Store
from mainspring.store.migrate import migrate
from tests.conftest import eventually, upgrade_to

MINUTE = 60_000


async def _insert_events(store: Store, at_and_type: list[tuple[int, str]]) -> None:
    async with store.transaction() as tx:
        for at, type_ in at_and_type:
            await tx.execute(text("INSERT INTO events (type, at, subject_kind, subject_id, data) "
                                  "VALUES (:type, :at, 'bench', 's', '{}')"), {"type": type_, "at": at})


async def test_events_stored_before_the_upgrade_are_counted_per_minute_by_it(blank_database_url: str) -> None:
    store = Store(blank_database_url)
    try:
        await store.run_sync(upgrade_to("core_0007"))
        start = 1_764_000_000_000 // MINUTE * MINUTE
        await _insert_events(store, [(start + 1, "machine.created"), (start + 59_999, "machine.created"),
                                     (start + MINUTE, "machine.created"), (start + 5, "interaction.created")])
        await migrate(store)
        await _insert_events(store, [(start + MINUTE + 7, "machine.created")])  # and the trigger counts from there on
        assert await outbox.count_per_minute(store, start) == {
            (start, "machine.created"): 2, (start, "interaction.created"): 1, (start + MINUTE, "machine.created"): 2}
        assert await outbox.count_per_minute(store, start + MINUTE) == {(start + MINUTE, "machine.created"): 2}
    finally:
        await store.close()


async def test_counts_older_than_their_reader_needs_go_even_when_events_are_kept_for_ever(
        settings: Settings, store: Store, clock: ManualClock) -> None:
    """``server.events_retention_ms`` unset keeps every event; the per-minute counts still go after
    ``EVENT_COUNTS_KEPT_MS`` (the retention loop prunes them alone), and the events stay."""
    settings.server.events_retention_ms = None
    now = clock.now_ms() // MINUTE * MINUTE
    await _insert_events(store, [(now - EVENT_COUNTS_KEPT_MS - 2 * MINUTE, "machine.created"), (now + 1, "machine.created")])
    assert len(await outbox.count_per_minute(store, 0)) == 2
    ctx = Context(settings=settings, store=store)
    loop = asyncio.create_task(prune_published_events(ctx))
    try:
        await eventually(lambda: _minutes(store), what="the old minute's count pruned")
    finally:
        ctx.stopping.set()
        store.notifier.signal_all()
        await asyncio.wait_for(loop, 5)
    assert await outbox.count_per_minute(store, 0) == {(now, "machine.created"): 1}
    async with store.read() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM events"))).scalar_one() == 2


async def _minutes(store: Store) -> bool:
    return len(await outbox.count_per_minute(store, 0)) == 1


async def test_a_long_events_retention_does_not_keep_the_counts_longer(store: Store, clock: ManualClock) -> None:
    now = clock.now_ms() // MINUTE * MINUTE
    await _insert_events(store, [(now - EVENT_COUNTS_KEPT_MS - 2 * MINUTE, "machine.created"), (now + 1, "machine.created")])
    assert await outbox.delete_events_before(store, now - 7 * 86_400_000) == 0
    assert await outbox.count_per_minute(store, 0) == {(now, "machine.created"): 1}
