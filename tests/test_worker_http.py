"""``mainspring worker APP --url URL --token T``: the same handlers through a server's HTTP API, with no
database credentials — end to end on both engines, and its faults: the server goes away while an item is
leased, the worker is SIGTERMed, a release answers ``409 lease_lost``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mainspring import App, HandlerContext, Interaction, Package, Wait
from mainspring.config import Settings
from mainspring.core.auth import create_token
from mainspring.store import Store
from mainspring.worker import Remote, run
from tests.conftest import eventually, show_log_on_failure
from tests.test_worker import SLOW_APP

pytestmark = pytest.mark.slow


class Refused(Exception):
    pass


@pytest.fixture
async def tokens(store: Store) -> dict[str, str]:
    """An admin token for the test, and one for the worker that reaches its queues and batcher only."""
    _id, admin = await create_token(store, "admin", ["admin"])
    _id, worker = await create_token(store, "worker", ["queues:orders", "queues:payments", "queues:strict", "queues:slow", "batchers:books"])
    return {"admin": admin, "worker": worker}


@pytest.fixture
async def api(servers: Any, tokens: dict[str, str]) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    [server] = await asyncio.to_thread(servers, 1)
    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {tokens['admin']}"}, timeout=30) as client:
        yield server, client


async def status(client: httpx.AsyncClient, item_id: str) -> dict[str, Any]:
    reply = await client.get(f"/v1/interactions/{item_id}")
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


async def test_a_worker_over_http_runs_the_apps_queues_children_and_batchers_end_to_end(
    api: tuple[Any, httpx.AsyncClient], tokens: dict[str, str], settings: Settings
) -> None:
    server, client = api
    app = App()

    @app.queue("orders")
    async def order(item: Interaction, ctx: HandlerContext) -> object:
        payments = await ctx.children("payment")
        if not payments:
            await ctx.create_child("payment", data={"amount": item.data["total"]}, queue="payments")
            return Wait()
        return {"paid": payments[0]["result"]}

    @app.queue("payments")
    async def pay(item: Interaction) -> object:
        return {"charged": item.data["amount"]}

    @app.queue("strict", fail_for=Refused)
    async def strict(item: Interaction) -> object:
        raise Refused("no such account")

    @app.batcher("books", max_size=2)
    def translate(package: Package) -> dict[str, Any]:
        return {t.id: {"chars": len(str(t.content))} for t in package.tasks}

    stop, started = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(run(settings, app, stop=stop, started=started, remote=Remote(server.url, tokens["worker"], 500)))
    await asyncio.wait_for(started.wait(), 60)
    try:
        made = (await client.post("/v1/queues/orders/interactions", json={"data": {"total": 60}})).json()
        refused = (await client.post("/v1/queues/strict/interactions", json={"data": {}})).json()
        for member in ("en", "ru"):
            reply = await client.post("/v1/batchers/books/tasks", json={"id": f"b1-{member}", "group": "b1", "member": member, "content": "Chapter"})
            assert reply.status_code == 202, reply.text

        async def order_paid() -> Any:
            found = await status(client, made["id"])
            return found["status"] == "completed" and found

        done = await eventually(order_paid, 60, "the order to be paid through its child")
        assert done["result"] == {"paid": {"charged": 60}}
        failed = await status(client, refused["id"])
        assert failed["status"] == "failed" and failed["attempts"] == 1, failed
        assert failed["error"] == "Refused: no such account" and failed["error_detail"]["type"].endswith("Refused"), failed
        assert "no such account" in failed["error_detail"]["traceback"]

        async def translated() -> bool:
            tasks = [(await client.get(f"/v1/batchers/books/tasks/b1-{m}")).json() for m in ("en", "ru")]
            return all(t["status"] == "done" for t in tasks)

        await eventually(translated, 60, "the worker to finish the package")
        assert (await client.get("/v1/batchers/books/tasks/b1-en")).json()["result"] == {"chars": 7}
    finally:
        stop.set()
        await asyncio.wait_for(worker, 60)


async def test_a_worker_over_http_with_a_wrong_token_stops_at_once_saying_so(api: tuple[Any, httpx.AsyncClient], settings: Settings) -> None:
    server, _client = api
    app = App()
    app.queue("orders")(lambda item: None)
    from mainspring.client import Unauthenticated

    with pytest.raises(Unauthenticated):
        await asyncio.wait_for(run(settings, app, remote=Remote(server.url, "ms_not-a-token")), 60)


async def test_a_release_after_the_server_went_away_and_came_back_completes_the_item_once(
    api: tuple[Any, httpx.AsyncClient], tokens: dict[str, str], settings: Settings
) -> None:
    server, client = api
    assert (await client.put("/v1/queues/orders", json={"lease_ms": 120_000})).status_code == 200
    app = App()
    running, finish = asyncio.Event(), asyncio.Event()
    calls = []

    @app.queue("orders")
    async def order(item: Interaction) -> object:
        calls.append(item.id)
        running.set()
        await finish.wait()
        return {"done": True}

    made = (await client.post("/v1/queues/orders/interactions", json={"data": {}})).json()
    stop = asyncio.Event()
    worker = asyncio.create_task(run(settings, app, stop=stop, remote=Remote(server.url, tokens["worker"], 500)))
    try:
        await asyncio.wait_for(running.wait(), 60)
        await asyncio.to_thread(server.kill)
        finish.set()  # the handler returns while the server is down: its release cannot be sent yet
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.start)

        async def completed() -> bool:
            return (await status(client, made["id"]))["status"] == "completed"

        await eventually(completed, 60, "the release to reach the server once it is back")
        assert calls == [made["id"]]
    finally:
        stop.set()
        await asyncio.wait_for(worker, 60)


async def test_a_release_refused_with_lease_lost_changes_nothing_and_the_worker_goes_on(
    api: tuple[Any, httpx.AsyncClient], tokens: dict[str, str], settings: Settings
) -> None:
    server, client = api
    # Heartbeats every 40 s: the release, not a heartbeat, is what meets the lost lease.
    assert (await client.put("/v1/queues/orders", json={"lease_ms": 120_000})).status_code == 200
    app = App()
    first_running, finish = asyncio.Event(), asyncio.Event()

    @app.queue("orders", concurrency=1)
    async def order(item: Interaction) -> object:
        if item.data == "first":
            first_running.set()
            await finish.wait()
        return {"handled": item.data}

    first = (await client.post("/v1/queues/orders/interactions", json={"data": "first"})).json()
    stop = asyncio.Event()
    worker = asyncio.create_task(run(settings, app, stop=stop, remote=Remote(server.url, tokens["worker"], 500)))
    try:
        await asyncio.wait_for(first_running.wait(), 60)
        assert (await client.post(f"/v1/interactions/{first['id']}/cancel")).status_code == 200
        finish.set()
        second = (await client.post("/v1/queues/orders/interactions", json={"data": "second"})).json()

        async def second_done() -> bool:
            return (await status(client, second["id"]))["status"] == "completed"

        await eventually(second_done, 60, "the worker to go on with the next item")
        cancelled = await status(client, first["id"])
        assert cancelled["status"] == "cancelled" and cancelled["result"] is None, cancelled
    finally:
        stop.set()
        await asyncio.wait_for(worker, 60)


async def test_one_sigterm_stops_a_worker_over_http_gracefully_and_its_handler_completes_the_item(
    api: tuple[Any, httpx.AsyncClient], tokens: dict[str, str], tmp_path: Path
) -> None:
    server, client = api
    (tmp_path / "slowapp.py").write_text(SLOW_APP)
    started, go = tmp_path / "started", tmp_path / "go"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MAINSPRING_")},
           "MAINSPRING_SERVER__GRACEFUL_SHUTDOWN_MS": "60000", "MAINSPRING_TOKEN": tokens["worker"]}
    log_path = tmp_path / "worker.log"
    show_log_on_failure("worker", log_path)
    with log_path.open("wb") as log:
        # No --database, no data dir: nothing of the store is at hand.
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mainspring.cli", "worker", "slowapp:app", "--url", server.url,
            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        item = (await client.post("/v1/queues/slow/interactions", json={"data": {"started": str(started), "go": str(go)}})).json()

        async def handler_running() -> bool:
            assert worker.returncode is None, log_path.read_text()
            return started.exists()

        await eventually(handler_running, 60, "the handler to start")
        worker.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        assert worker.returncode is None, log_path.read_text()
        go.touch()
        assert await asyncio.wait_for(worker.wait(), 60) == 0, log_path.read_text()
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    output = log_path.read_text()
    assert "by force" not in output and "mainspring-data" not in os.listdir(tmp_path), output
    done = await status(client, item["id"])
    assert done["status"] == "completed" and done["result"] == {"finished": True}, done
