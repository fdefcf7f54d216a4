"""The batching face at /metrics: tasks and packages by batcher and status, claims and lease expiries."""

from __future__ import annotations

from tests.batching.conftest import claim, eventually, put_batcher, submit, submit_pair, wait_status
from tests.core.test_metrics import _scrape, _value


async def test_tasks_packages_claims_and_lease_expiries_are_counted_per_batcher(client, clock) -> None:
    await put_batcher(client, "metered", lease_ms=1000)
    before = await _scrape(client)
    claims = _value(before, "mainspring_batching_package_claims_total", batcher="metered") or 0
    expiries = _value(before, "mainspring_batching_lease_expiries_total", batcher="metered") or 0

    await submit_pair(client, "79", name="metered")
    await submit(client, "80-en", "80", "en", name="metered")
    text = await _scrape(client)
    assert _value(text, "mainspring_batching_tasks", batcher="metered", status="pending") == 3

    async def forming() -> bool:  # min_size reached: the dispatcher's next round starts the linger timer
        return _value(await _scrape(client), "mainspring_batching_forming_tasks", batcher="metered") == 3

    await eventually(forming, what="the forming batch to be counted")

    await submit_pair(client, "81", name="metered")
    clock.advance(5000)
    await wait_status(client, ["79-en", "81-en"], "packed", name="metered")
    package = await claim(client, "metered")
    assert package is not None
    text = await _scrape(client)
    assert _value(text, "mainspring_batching_packages", batcher="metered", status="claimed") == 1
    assert _value(text, "mainspring_batching_tasks", batcher="metered", status="claimed") == package["size"]
    assert _value(text, "mainspring_batching_package_claims_total", batcher="metered") == claims + 1

    clock.advance(1001)  # the lease runs out; the dispatcher puts the package back

    async def expired() -> bool:
        value = _value(await _scrape(client), "mainspring_batching_lease_expiries_total", batcher="metered")
        return value == expiries + 1

    await eventually(expired, what="the lease expiry to be counted")
    text = await _scrape(client)
    assert _value(text, "mainspring_batching_packages", batcher="metered", status="ready") == 1
    # Labels are batcher names (and statuses) only, never a package or task id.
    assert package["id"] not in text and "79-en" not in text
