"""Business metrics at /metrics: gauges read from the store when scraped, counters counted as things happen."""

from __future__ import annotations

import re

import httpx

from mainspring.core import metrics as core_metrics


def _value(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if match and ",".join(sorted((match.group(1) or "").split(","))) == wanted:
            return float(match.group(2))
    return None


async def _scrape(client: httpx.AsyncClient) -> str:
    core_metrics.REFRESH_S = 0.0  # every scrape reads the store in these tests
    answer = await client.get("/metrics")
    assert answer.status_code == 200
    return answer.text


async def test_interactions_are_counted_by_queue_and_status(client: httpx.AsyncClient) -> None:
    for _ in range(3):
        await client.post("/v1/queues/mq/interactions", json={})
    await client.post("/v1/queues/mq/interactions", json={"process_in_ms": 60_000})
    text = await _scrape(client)
    assert _value(text, "mainspring_interactions", queue="mq", status="ready") == 3
    assert _value(text, "mainspring_interactions", queue="mq", status="scheduled") == 1
    assert _value(text, "mainspring_interactions_oldest_ready_seconds", queue="mq") is not None


async def test_the_busiest_owners_of_a_queue_with_owner_by_have_their_ready_and_processing_counts(client: httpx.AsyncClient) -> None:
    await client.put("/v1/queues/mo", json={"owner_by": "source", "per_owner": {"concurrency": 1}})
    items = [{"source": "noisy"}] * 4 + [{"source": "quiet"}]
    await client.post("/v1/queues/mo/interactions/bulk", json={"interactions": items})
    await client.post("/v1/queues/mo/lease", json={"worker": "w", "max": 10})
    text = await _scrape(client)
    assert _value(text, "mainspring_interactions_owner", queue="mo", owner="noisy", status="ready") == 3
    assert _value(text, "mainspring_interactions_owner", queue="mo", owner="noisy", status="processing") == 1
    assert _value(text, "mainspring_interactions_owner", queue="mo", owner="quiet", status="processing") == 1
    assert _value(text, "mainspring_interactions_owner", queue="mq", owner="", status="ready") is None, "only queues with owner_by"


async def test_processed_leases_are_counted_by_outcome(client: httpx.AsyncClient) -> None:
    before = _value(await _scrape(client), "mainspring_interactions_processed_total", queue="mp", outcome="completed") or 0
    await client.post("/v1/queues/mp/interactions", json={})
    [held] = (await client.post("/v1/queues/mp/lease", json={"worker": "w"})).json()["interactions"]
    await client.post(f"/v1/interactions/{held['id']}/release", json={"token": held["lease"]["token"], "outcome": {"complete": {"result": 1}}})
    after = _value(await _scrape(client), "mainspring_interactions_processed_total", queue="mp", outcome="completed")
    assert after == before + 1


async def test_the_outbox_head_and_publisher_lag_are_gauges(client: httpx.AsyncClient) -> None:
    await client.post("/v1/queues/mh/interactions", json={})
    text = await _scrape(client)
    assert (_value(text, "mainspring_outbox_head_position") or 0) >= 0
    assert _value(text, "mainspring_outbox_unnumbered_events") is not None


async def test_open_alerts_are_a_gauge_by_code_that_an_ack_takes_down(client: httpx.AsyncClient, app: object) -> None:
    from mainspring.core.alerts import raise_alert

    store = app.state.context.store  # type: ignore[attr-defined]
    async with store.transaction() as tx:
        alert_id = await raise_alert(tx, "disk_full", "host", "h1", "the disk is full")
    assert _value(await _scrape(client), "mainspring_alerts_open", code="disk_full") == 1
    await client.post(f"/v1/alerts/{alert_id}/ack")
    assert _value(await _scrape(client), "mainspring_alerts_open", code="disk_full") is None
