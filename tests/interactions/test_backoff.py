"""Retries that back off (API.md §3): a queue's ``backoff``, ``max_delay_ms`` and ``jitter``, set over HTTP or
in ``@app.queue``; and per handler, which exceptions are retried and which fail the item at once."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mainspring.app import App, AppError
from mainspring.config import Settings
from mainspring.interactions import service
from mainspring.interactions.worker import Worker
from mainspring.store import ManualClock, Store, format_time
from tests.conftest import eventually
from tests.interactions.conftest import create, get, lease, put_queue, release


async def test_a_queue_has_fixed_backoff_without_jitter_unless_told_otherwise(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/queues/fresh")).json()
    assert (body["backoff"], body["max_delay_ms"], body["jitter"]) == ("fixed", 3_600_000, False)
    body = await put_queue(client, "fresh", backoff="exponential", max_delay_ms=5000, jitter=True)
    assert (body["backoff"], body["max_delay_ms"], body["jitter"]) == ("exponential", 5000, True)
    assert (await client.get("/v1/queues/fresh")).json()["backoff"] == "exponential"


@pytest.mark.parametrize("bad", [{"backoff": "linear"}, {"max_delay_ms": -1}, {"jitter": "sometimes"}, {"backoff": None, "jitter": 3}])
async def test_bad_backoff_settings_are_422_and_change_nothing(client: httpx.AsyncClient, bad: dict[str, Any]) -> None:
    reply = await client.put("/v1/queues/strict", json=bad)
    assert reply.status_code == 422 and reply.json()["code"] == "invalid_request", reply.text
    assert (await client.get("/v1/queues/strict")).json()["backoff"] == "fixed"


async def test_exponential_backoff_doubles_the_delay_of_each_failed_attempt_up_to_max_delay(
    client: httpx.AsyncClient, clock: ManualClock
) -> None:
    await put_queue(client, error_delay_ms=1000, backoff="exponential", max_delay_ms=5000, max_attempts=10)
    item = await create(client)
    delays = []
    for _ in range(5):
        [held] = await lease(client)
        retried = await release(client, held, {"retry": {"error": "flaky"}})
        delays.append(next_processing_in(retried, clock))
        clock.advance(delays[-1] - 1)
        assert await lease(client) == [], "due before its delay"
        clock.advance(1)
    assert delays == [1000, 2000, 4000, 5000, 5000]
    assert (await get(client, item["id"]))["attempts"] == 5


async def test_fixed_backoff_waits_error_delay_after_every_attempt(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, error_delay_ms=1500, max_attempts=10)
    await create(client)
    delays = []
    for _ in range(3):
        [held] = await lease(client)
        delays.append(next_processing_in(await release(client, held, {"retry": {"error": "flaky"}}), clock))
        clock.advance(delays[-1])
    assert delays == [1500, 1500, 1500]


async def test_jitter_spreads_retries_between_zero_and_the_backoffs_delay(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, error_delay_ms=10_000, jitter=True)
    for n in range(30):
        await create(client, data=n)
    delays = [next_processing_in(await release(client, held, {"retry": {"error": "flaky"}}), clock)
              for held in await lease(client, max=30)]
    assert len(delays) == 30 and all(0 <= d <= 10_000 for d in delays), delays
    assert len(set(delays)) > 10, delays


async def test_an_expired_lease_is_retried_after_the_backoff_of_its_attempt(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, error_delay_ms=1000, backoff="exponential", lease_ms=500, max_attempts=10)
    item = await create(client)
    for expected in (1000, 2000, 4000):
        await lease(client)
        clock.advance(500)
        assert await lease(client) == []  # finds the expired lease, takes nothing: the retry is not due yet
        expired = await get(client, item["id"])
        assert (expired["status"], expired["error"]) == ("scheduled", "lease expired")
        assert next_processing_in(expired, clock) == expected
        clock.advance(expected)


def next_processing_in(item: dict[str, Any], clock: ManualClock) -> int:
    """How long from now the item is due (ms), read from its RFC 3339 ``next_processing``."""
    for delay in range(0, 3_600_001):
        if format_time(clock.now_ms() + delay) == item["next_processing"]:
            return delay
    raise AssertionError(f"next_processing {item['next_processing']} is not within the hour")


# --- @app.queue ----------------------------------------------------------------------------------------


async def test_app_queue_sets_the_retry_policy_it_names_on_a_new_queue_and_an_existing_one_keeps_the_rest(
    store: Store, settings: Settings
) -> None:
    cfg = settings.interactions
    app = App()
    app.queue("new", error_delay_ms=250, backoff="exponential", max_delay_ms=4000, jitter=True, max_attempts=7)(lambda item: None)
    app.queue("tuned", backoff="exponential")(lambda item: None)
    await service.put_queue(store, cfg, "tuned", {"error_delay_ms": 100})
    worker = Worker(store, app, cfg, poll_ms=200)
    await worker.start()
    try:
        new = await service.get_queue(store, cfg, "new")
        assert {k: new[k] for k in ("error_delay_ms", "backoff", "max_delay_ms", "jitter", "max_attempts")} == {
            "error_delay_ms": 250, "backoff": "exponential", "max_delay_ms": 4000, "jitter": True, "max_attempts": 7}
        tuned = await service.get_queue(store, cfg, "tuned")
        assert (tuned["backoff"], tuned["error_delay_ms"]) == ("exponential", 100), "the code's backoff, the stored delay"
    finally:
        await worker.stop()


def test_app_queue_checks_its_retry_options_when_the_decorator_runs() -> None:
    app = App()
    with pytest.raises(AppError, match="backoff"):
        app.queue("q", backoff="linear")  # type: ignore[arg-type]
    with pytest.raises(AppError, match="retry_for"):
        app.queue("q", retry_for=(ValueError, "TimeoutError"))  # type: ignore[arg-type]
    with pytest.raises(AppError, match="fail_for"):
        app.queue("q", fail_for=int)  # type: ignore[arg-type]
    app.queue("q", retry_for=ConnectionError, fail_for=(KeyError, ValueError))(lambda item: None)
    assert app.queues["q"].options["retry_for"] == (ConnectionError,)


class Flaky(Exception):
    pass


class Broken(Exception):
    pass


async def test_a_handler_retries_only_the_exceptions_it_names_and_fails_at_once_on_the_others(
    store: Store, settings: Settings, clock: ManualClock
) -> None:
    cfg = settings.interactions
    app = App()
    raises = {"flaky": Flaky("try again"), "broken": Broken("bad data"), "wrong": ValueError("wrong value")}

    @app.queue("strict", retry_for=(Flaky, ValueError), fail_for=ValueError)
    async def handle(item: Any) -> Any:
        raise raises[item.data]

    await service.put_queue(store, cfg, "strict", {"error_delay_ms": 60_000, "max_attempts": 5})
    worker = Worker(store, app, cfg, poll_ms=200)
    await worker.start()
    try:
        made = {kind: (await service.create(store, cfg, "strict", {"data": kind}))[0]["id"] for kind in raises}

        async def settled() -> bool:
            found = [await service.read(store, i) for i in made.values()]
            return all(f["status"] in ("scheduled", "failed") for f in found)

        await eventually(settled, 20, "the item to settle")
        flaky = await service.read(store, made["flaky"])
        assert (flaky["status"], flaky["error"]) == ("scheduled", "Flaky: try again")
        for kind, type_name in (("broken", "Broken"), ("wrong", "ValueError")):
            failed = await service.read(store, made[kind])
            assert failed["status"] == "failed" and failed["attempts"] == 1, failed
            assert failed["error"].startswith(f"{type_name}: ") and failed["error_detail"]["type"].endswith(type_name), failed
    finally:
        await worker.stop()
