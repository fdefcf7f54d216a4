"""Events written per minute and type (issue 26): kept with the writes (migration core_0008, ``store.counts``)
for the dashboard's throughput chart; the chart's own numbers against a count of the events are in
tests/ui/test_pages.py."""

from __future__ import annotations

from sqlalchemy import text

from mainspring.core import outbox
from mainspring.store import Store
from mainspring.store.migrate import migrate
from tests.conftest import upgrade_to

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
