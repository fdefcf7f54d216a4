"""``mainspring worker``: an app's queues and batchers in a process of their own, with /healthz and /metrics."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from mainspring import App, Interaction, Package
from mainspring.app import AppError
from mainspring.config import Settings
from mainspring.store import Clock
from mainspring.worker import run, runnable
from tests.conftest import eventually, free_port, show_log_on_failure
from tests.heads import assert_heads_bounded


def test_a_worker_refuses_an_app_with_nothing_it_can_run_and_says_what_it_runs() -> None:
    with pytest.raises(AppError, match="no queue handler or batch worker"):
        runnable(App())
    only_processors = App()
    only_processors.processor("invoices")(lambda kind, args, machine: {})
    with pytest.raises(AppError, match="only processors: invoices"):
        runnable(only_processors)
    app = App()
    app.queue("emails", concurrency=3)(lambda item: None)
    app.batcher("books", concurrency=2)(lambda package: None)
    assert runnable(app) == "queues emails (concurrency 3); batchers books (concurrency 2)"


def test_a_worker_says_where_the_apps_processors_run() -> None:
    app = App()
    app.queue("emails")(lambda item: None)
    app.processor("invoices")(lambda kind, args, machine: {})
    said = runnable(app)
    assert said.startswith("queues emails (concurrency 10)")
    assert "processors invoices run in the server (mainspring serve --app), not here" in said


async def translate_a_pair(client: httpx.AsyncClient, settings: Settings, group: str) -> list[list[str]]:
    """Run a worker whose app has only a batcher, submit a pair of tasks, wait until both are done: answers the
    packages its handler ran, each as its tasks' ids."""
    seen: list[list[str]] = []
    app = App()

    @app.batcher("books", max_size=2)
    async def translate(package: Package) -> dict[str, Any]:
        seen.append(sorted(t.id for t in package.tasks))
        return {t.id: {"by": "worker"} for t in package.tasks}

    stop, started = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(run(settings, app, stop=stop, started=started))
    await asyncio.wait_for(started.wait(), 30)
    try:
        for member in ("en", "ru"):
            reply = await client.post("/v1/batchers/books/tasks", json={"id": f"{group}-{member}", "group": group, "member": member, "content": member})
            assert reply.status_code == 202, reply.text

        async def done() -> bool:
            tasks = [(await client.get(f"/v1/batchers/books/tasks/{group}-{m}")).json() for m in ("en", "ru")]
            return all(t["status"] == "done" for t in tasks)

        await eventually(done, 30, "the worker finished the package")
        assert (await client.get(f"/v1/batchers/books/tasks/{group}-en")).json()["result"] == {"by": "worker"}
        return seen
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)


# The app in this process sweeps expired leases: on the tests' manual clock (months ahead) it would take back
# the package the worker (on the real clock) holds, and the worker would run it twice.
@pytest.mark.parametrize("clock", [Clock()], ids=["real-clock"])
async def test_a_worker_runs_the_batchers_of_an_app_that_has_no_queue(client: httpx.AsyncClient, settings: Settings) -> None:
    assert await translate_a_pair(client, settings, "79") == [["79-en", "79-ru"]]


@pytest.mark.parametrize("clock", [Clock()], ids=["real-clock"])
async def test_a_completion_the_store_could_not_take_is_sent_again_and_the_package_runs_once(
    client: httpx.AsyncClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that drops the connection as a batch worker completes its package (a restart, a failover) must
    not make the worker give the package back: its work is done, and doing it again is a second effect."""
    from mainspring.batching import cafe

    complete, failures = cafe.complete_package, [ConnectionResetError("the store went away"), OSError("no route to host")]

    async def flaky_complete(*args: Any) -> Any:
        if failures:
            raise failures.pop(0)
        return await complete(*args)

    monkeypatch.setattr(cafe, "complete_package", flaky_complete)
    assert await translate_a_pair(client, settings, "80") == [["80-en", "80-ru"]]
    assert not failures


async def test_a_worker_serves_healthz_and_metrics_on_its_port(client: httpx.AsyncClient, settings: Settings) -> None:
    app = App()
    handled = asyncio.Event()

    @app.queue("emails", concurrency=2)
    async def send(item: Interaction) -> object:
        handled.set()
        return {"sent": item.data}

    port = free_port()
    stop, started = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(run(settings, app, http_port=port, stop=stop, started=started))
    await asyncio.wait_for(started.wait(), 30)
    try:
        # Due long ago on any clock: the test app runs on a manual clock, the worker on the real one.
        await client.post("/v1/queues/emails/interactions", json={"data": "hi", "process_at": "2000-01-01T00:00:00Z"})
        await asyncio.wait_for(handled.wait(), 30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as probe:

            async def healthy() -> Any:
                reply = await probe.get("/healthz")
                body = reply.json()
                return reply.status_code == 200 and body["queues"]["emails"]["handled"] == 1 and body

            body = await eventually(healthy, 30, "healthz to count the handled item")
            assert body["status"] == "ok" and body["batchers"] == []
            metrics = await probe.get("/metrics")
            assert metrics.status_code == 200
            assert 'mainspring_worker_handled{queue="emails"} 1.0' in metrics.text
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)


async def test_a_workers_health_port_refuses_a_head_too_large_and_closes_one_never_finished(settings: Settings) -> None:
    app = App()
    app.queue("emails")(lambda item: None)
    bounded = settings.model_copy(update={"server": settings.server.model_copy(update={"max_head_bytes": 8192, "head_timeout_ms": 300})})
    port = free_port()
    stop, started = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(run(bounded, app, http_port=port, stop=stop, started=started))
    await asyncio.wait_for(started.wait(), 30)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as probe:
            await eventually(lambda: _answers(probe), 30, "the health port to listen")
        await assert_heads_bounded(port)
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)


async def _answers(probe: httpx.AsyncClient) -> bool:
    try:
        return (await probe.get("/healthz")).status_code == 200
    except httpx.ConnectError:
        return False


SLOW_APP = '''
import asyncio
import pathlib

from mainspring import App

app = App()


@app.queue("slow", concurrency=1)
async def slow(item):
    pathlib.Path(item.data["started"]).touch()
    while not pathlib.Path(item.data["go"]).exists():
        await asyncio.sleep(0.02)
    return {"finished": True}
'''


@pytest.mark.slow
# The app in this process runs on the real clock too: on the tests' manual clock (months ahead) its sweeper
# would expire the worker's lease while the handler runs.
@pytest.mark.parametrize("clock", [Clock()], ids=["real-clock"])
async def test_one_sigterm_stops_a_worker_with_a_health_port_gracefully_and_its_handler_completes_the_item(
    client: httpx.AsyncClient, database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "slowapp.py").write_text(SLOW_APP)
    started, go = tmp_path / "started", tmp_path / "go"
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MAINSPRING_")},
           "MAINSPRING_SERVER__GRACEFUL_SHUTDOWN_MS": "60000", "MAINSPRING_SERVER__POLL_INTERVAL_MS": "200"}
    log_path = tmp_path / "worker.log"
    show_log_on_failure("worker", log_path)
    with log_path.open("wb") as log:
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mainspring.cli", "worker", "slowapp:app", "--database", database_url, "--http-port", str(port),
            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # The worker leases on the real clock, this server sweeps expired leases on the test's manual clock
        # (weeks ahead): a lease shorter than that gap was swept as expired within a second (flaky).
        assert (await client.put("/v1/queues/slow", json={"lease_ms": 5 * 365 * 86_400_000})).status_code == 200
        reply = await client.post("/v1/queues/slow/interactions",
                                  json={"data": {"started": str(started), "go": str(go)}, "process_at": "2000-01-01T00:00:00Z"})
        item = reply.json()["id"]

        async def handler_running() -> bool:
            assert worker.returncode is None, log_path.read_text()
            return started.exists()

        await eventually(handler_running, 60, "the handler to start")
        worker.send_signal(signal.SIGTERM)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as probe:

            async def stopping() -> bool:
                assert worker.returncode is None, log_path.read_text()
                return (await probe.get("/healthz")).json()["status"] == "stopping"

            await eventually(stopping, 30, "the worker to report it is stopping")
        go.touch()
        assert await asyncio.wait_for(worker.wait(), 60) == 0, log_path.read_text()
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    output = log_path.read_text()
    assert "by force" not in output, output
    done = (await client.get(f"/v1/interactions/{item}")).json()
    assert done["status"] == "completed" and done["result"] == {"finished": True}, f"{done}\n{output}"


async def test_a_worker_registers_the_apps_periodic_schedules_and_two_workers_fire_each_tick_once(settings: Settings) -> None:
    from sqlalchemy import select, update

    from mainspring.interactions import periodic
    from mainspring.interactions.tables import interaction_schedules, interactions
    from mainspring.store import Store

    handled: list[Any] = []
    app = App()

    @app.periodic("* * * * *", queue="reports", data={"kind": "nightly"})
    async def nightly(item: Interaction) -> None:
        handled.append(item.message_id)

    assert "schedules nightly (* * * * * into reports)" in runnable(app)
    # No server runs: the two workers alone keep the schedule (both on the wall clock, as in production).
    store = Store(settings.server.database_url(), clock=Clock())
    await store.start()
    stop = asyncio.Event()
    starts = [asyncio.Event(), asyncio.Event()]
    workers = [asyncio.create_task(run(settings, app, stop=stop, started=started)) for started in starts]
    try:
        for started in starts:
            await asyncio.wait_for(started.wait(), 30)
        assert [(s["name"], s["source"], s["queue"]) for s in await periodic.list_schedules(store)] == [("nightly", "app", "reports")]
        # Make the last minute's tick due now: both workers' loops find it.
        minute = Clock().now_ms() // 60_000 * 60_000
        async with store.transaction() as tx:
            await tx.execute(update(interaction_schedules).values(next_tick=minute))

        async def ran() -> bool:
            return bool(handled)

        await eventually(ran, 30, "a worker fired the tick and handled its interaction")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), 30)
    async with store.read() as conn:
        created = [r[0] for r in (await conn.execute(select(interactions.c.message_id).where(interactions.c.queue == "reports"))).all()]
    await store.close()
    assert created[0] == f"periodic:nightly:{minute}", created
    # Each tick once, whichever worker fired it, and handled once (a minute may have turned meanwhile).
    assert len(created) == len(set(created)) and sorted(handled) == sorted(set(handled)) and set(handled) <= set(created)


@pytest.mark.parametrize("own_process", [False, True])
async def test_a_worker_in_a_process_of_its_own_leaves_its_start_up_heap_out_of_full_collections(settings: Settings, own_process: bool) -> None:
    """``mainspring worker`` freezes what start-up made (gc.freeze) before its first item; a worker embedded in
    another process (``own_process`` False) leaves that process's collector alone."""
    import gc

    app = App()
    app.queue("emails")(lambda item: None)
    gc.unfreeze()
    stop, started = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(run(settings, app, stop=stop, started=started, own_process=own_process))
    try:
        await asyncio.wait_for(started.wait(), 30)
        assert (gc.get_freeze_count() > 0) is own_process
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
        gc.unfreeze()
