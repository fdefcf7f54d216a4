"""``@app.batcher`` workers in the server: they receive whole packages, sync or async, and retry on errors."""

from __future__ import annotations

import threading

import pytest

from mainspring.app import App
from mainspring.batching.worker import recover
from tests.batching.conftest import put_batcher, submit_pair, wait_status

SEEN: dict[str, list[list[str]]] = {}


@pytest.fixture
def registry() -> App:
    SEEN.clear()
    app = App()

    @app.batcher("books", min_size=2, max_size=2, group_size=2, lease_ms=30_000)
    async def translate(package) -> dict[str, object]:
        SEEN.setdefault("books", []).append([t.id for t in package.tasks])
        return {t.id: {"words": len(t.content.split()), "version": t.version} for t in package.tasks}

    @app.batcher("sync-books", max_size=2)
    def translate_in_a_thread(package) -> None:
        SEEN.setdefault("sync-books", []).append([threading.current_thread().name])

    @app.batcher("flaky", max_size=2, max_attempts=2)
    async def always_fails(package) -> None:
        SEEN.setdefault("flaky", []).append([str(package.attempts)])
        raise RuntimeError("the back server is down")

    return app


async def test_an_async_worker_receives_the_whole_package_and_its_results_are_stored(client) -> None:
    batcher = (await client.get("/v1/batchers/books")).json()
    assert (batcher["max_size"], batcher["lease_ms"]) == (2, 30_000)  # created from the registration
    ids = await submit_pair(client, "79", content="a b c")
    done = await wait_status(client, ids, "done")
    assert SEEN["books"] == [ids]
    assert done[0]["result"] == {"words": 6, "version": 1}


async def test_a_sync_worker_runs_in_a_thread(client) -> None:
    ids = await submit_pair(client, "79", name="sync-books")
    await wait_status(client, ids, "done", name="sync-books")
    assert SEEN["sync-books"][0][0] != threading.current_thread().name


async def test_a_failing_worker_retries_until_max_attempts_then_fails_the_tasks(client) -> None:
    ids = await submit_pair(client, "79", name="flaky")
    failed = await wait_status(client, ids, "failed", name="flaky")
    assert "the back server is down" in failed[0]["error"]
    assert SEEN["flaky"] == [["1"], ["2"]]


async def test_stored_settings_win_over_the_registration_at_the_next_start(app, client) -> None:
    await put_batcher(client, name="books", max_size=4)
    await recover(app.state.context)  # what the next start-up runs
    assert (await client.get("/v1/batchers/books")).json()["max_size"] == 4
