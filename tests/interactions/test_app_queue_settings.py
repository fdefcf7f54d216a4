"""``@app.queue``'s queue settings (the retry policy, owners, aging) apply when a worker starts, whether the queue is
new or was created before by a producer or ``PUT`` (issue 35, item 1): the code wins for the options it names, says
what it changed, and leaves every other stored setting alone — with the store and over HTTP."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from mainspring import App, Interaction
from mainspring.client._async.interactions import AsyncInteractionsClient
from mainspring.config import Settings
from mainspring.interactions import service
from mainspring.interactions.sources import HttpQueues
from mainspring.interactions.worker import Worker
from mainspring.producer import Producer
from mainspring.store import Store


def jobs_app(**options: Any) -> App:
    app = App()

    @app.queue("jobs", **options)
    async def job(item: Interaction) -> object:
        return None

    return app


async def started(worker: Worker) -> None:
    await worker.start()
    await worker.stop(False)


async def test_a_store_workers_queue_options_apply_to_a_queue_a_producer_created_first(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = settings.interactions
    async with Producer(settings) as p:
        await p.create("jobs", {"n": 1})
    await service.put_queue(store, cfg, "jobs", {"concurrency": 3, "rate_limit": {"count": 5, "per_ms": 1000}})
    with caplog.at_level(logging.INFO, logger="mainspring.interactions.worker"):
        await started(Worker(store, jobs_app(backoff="exponential", max_attempts=4, error_delay_ms=500), cfg))
    queue = await service.get_queue(store, cfg, "jobs")
    assert (queue["backoff"], queue["max_attempts"], queue["error_delay_ms"]) == ("exponential", 4, 500)
    assert (queue["concurrency"], queue["rate_limit"]) == (3, {"count": 5, "per_ms": 1000}), "settings the code does not name stay"
    said = caplog.text
    assert "jobs" in said and "backoff 'fixed' → 'exponential'" in said and "max_attempts 10 → 4" in said, said


async def test_a_worker_whose_options_match_the_stored_settings_changes_and_says_nothing(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "jobs", {"max_attempts": 4, "owner_by": "user", "per_owner": {"concurrency": 2}})
    before = await service.get_queue(store, cfg, "jobs")
    with caplog.at_level(logging.INFO, logger="mainspring.interactions.worker"):
        await started(Worker(store, jobs_app(max_attempts=4, owner_by="user", per_owner={"concurrency": 2}), cfg))
    assert await service.get_queue(store, cfg, "jobs") == before
    assert "takes the settings" not in caplog.text


async def test_an_http_workers_queue_options_apply_to_an_existing_queue_too(
    app: Any, store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "jobs", {"retention_ms": 60_000})
    transport = httpx.ASGITransport(app=app)
    async with AsyncInteractionsClient("http://mainspring.test", transport=transport) as client:
        with caplog.at_level(logging.INFO, logger="mainspring.interactions.worker"):
            await started(Worker(HttpQueues(client), jobs_app(backoff="exponential", jitter=True, owner_by="source", fair=True), cfg))
    queue = await service.get_queue(store, cfg, "jobs")
    assert (queue["backoff"], queue["jitter"], queue["owner_by"], queue["fair"], queue["retention_ms"]) == ("exponential", True, "source", True, 60_000)
    assert "backoff 'fixed' → 'exponential'" in caplog.text and "owner_by None → 'source'" in caplog.text
