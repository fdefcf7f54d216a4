"""Tasks and packages by batcher and status (issue 26): kept with the writes (migration batching_0004,
``store.counts``), so the overview, /metrics and a batcher's page read them without counting the rows — and
exact through every state change and retention: each step compares them with a count of the rows themselves."""

from __future__ import annotations

import pytest

from mainspring.batching import data, service
from mainspring.batching.tables import batch_packages, batch_tasks, batching_counts
from mainspring.store import ManualClock, Store
from tests.batching.conftest import claim, put_batcher, submit, submit_pair, wait_status
from tests.batching.test_retention import DAY_MS, _finish
from tests.conftest import assert_counts_exact


@pytest.fixture
def settings(settings):
    settings.batching.retention_ms = None  # this test prunes itself, at the moment it chooses
    return settings


async def exact(store: Store) -> dict[str, dict[str, int]]:
    """Both kinds checked against their rows, per batcher; answers what the overview shows."""
    await assert_counts_exact(store, batching_counts, "tasks", batch_tasks, "status", "batcher")
    await assert_counts_exact(store, batching_counts, "packages", batch_packages, "status", "batcher")
    async with store.read() as conn:
        return await data.count_by_status(conn)


async def test_task_and_package_counts_stay_exact_through_every_state_and_retention(client, clock: ManualClock, store: Store) -> None:
    await put_batcher(client, max_wait_ms=30 * DAY_MS)
    await put_batcher(client, "films", max_wait_ms=30 * DAY_MS)
    await submit(client, "f-1", "1", "en", name="films")
    await submit_pair(client, "79")
    assert (await exact(store))["tasks"] == {"pending": 3}
    clock.advance(5000)
    await wait_status(client, ["79-en", "79-ru"], "packed")
    await _finish(client)
    await submit(client, "79-en-dup", "79", "en", "79 in en ", expect=200)  # a duplicate: rejected at once
    await submit_pair(client, "83")
    clock.advance(5000)
    await wait_status(client, ["83-en", "83-ru"], "packed")
    await _finish(client, ok=False)
    await submit_pair(client, "80")
    clock.advance(5000)
    await wait_status(client, ["80-en", "80-ru"], "packed")
    assert await claim(client) is not None
    before = await exact(store)
    assert sum(before["packages"].values()) == 3 and before["tasks"]["rejected"] == 1

    clock.advance(8 * DAY_MS)
    pruned = await service.prune_finished(store, clock.now_ms() - 7 * DAY_MS, 500)
    assert pruned.packages == 2
    after = await exact(store)
    assert sum(after["packages"].values()) == 1 and "rejected" not in after["tasks"]
    async with store.read() as conn:
        assert await data.count_batcher_tasks(conn, "films") == {"pending": 1}
