"""``POST /v1/queues/{queue}/release`` and ``…/heartbeat`` take an entry whose token this server handed out for a
lease of that queue without reading its item's queue (the token fences the write), and read the queue of any other
entry: answers and changes are those of a release that read every item."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from mainspring import App, Interaction
from mainspring.client._async.interactions import AsyncInteractionsClient
from mainspring.config import Settings
from mainspring.interactions import leasing, service
from mainspring.interactions.sources import HttpQueues
from mainspring.interactions.worker import Worker
from mainspring.store import Store
from tests.interactions.conftest import create, get, lease


def _release(item_id: str, token: str) -> dict[str, Any]:
    return {"id": item_id, "token": token, "outcome": {"complete": {}}}


async def test_a_token_this_server_leased_for_the_queue_does_not_release_an_item_of_another_queue(client: httpx.AsyncClient) -> None:
    await create(client, queue="q")
    await create(client, queue="other")
    (mine,) = await lease(client, queue="q", max=1)
    (theirs,) = await lease(client, queue="other", max=1)
    # The id of the other queue's item with this queue's token (which this server remembers for "q").
    answer = await client.post("/v1/queues/q/release", json={"releases": [_release(theirs["id"], mine["lease"]["token"])]})
    assert answer.json() == {"released": [], "lease_lost": [theirs["id"]]}
    beat = await client.post("/v1/queues/q/heartbeat", json={"leases": [{"id": theirs["id"], "token": mine["lease"]["token"]}]})
    assert beat.json() == {"held": [], "lease_lost": [theirs["id"]]}
    assert (await get(client, theirs["id"]))["status"] == "processing"
    # This queue's item with its own token, sent through the other queue.
    answer = await client.post("/v1/queues/other/release", json={"releases": [_release(mine["id"], mine["lease"]["token"])]})
    assert answer.json() == {"released": [], "lease_lost": [mine["id"]]}
    assert (await get(client, mine["id"]))["status"] == "processing"
    # Its own token, through its own queue, still releases it.
    answer = await client.post("/v1/queues/other/release", json={"releases": [_release(theirs["id"], theirs["lease"]["token"])]})
    assert answer.json() == {"released": [theirs["id"]], "lease_lost": []}


async def test_a_lease_taken_elsewhere_is_released_through_this_server_and_not_through_another_queue(
    client: httpx.AsyncClient, store: Store, settings: Settings
) -> None:
    first = await create(client, queue="q")
    second = await create(client, queue="q")
    # Leased beside this server (another server, or a worker on the store): its token is not one this server handed out.
    taken = (await leasing.lease(store, settings.interactions, "q", "w", 2, None)).items
    tokens = {item["id"]: item["lease"]["token"] for item in taken}
    assert set(tokens) == {first["id"], second["id"]}
    wrong = await client.post("/v1/queues/other/release", json={"releases": [_release(first["id"], tokens[first["id"]])]})
    assert wrong.json() == {"released": [], "lease_lost": [first["id"]]}
    answer = await client.post("/v1/queues/q/release", json={"releases": [_release(i, t) for i, t in tokens.items()]})
    assert answer.json() == {"released": [first["id"], second["id"]], "lease_lost": []}
    assert (await get(client, first["id"]))["status"] == "completed"


async def test_an_http_workers_result_that_is_not_json_fails_its_item_and_the_rest_of_the_batch_completes(
    app: Any, store: Store, settings: Settings
) -> None:
    cfg = settings.interactions
    made = [item for item, _ in [await service.create(store, cfg, "jobs", {"data": {"n": n}}) for n in range(5)]]
    worker_app = App()
    handled = asyncio.Event()
    seen: set[int] = set()

    @worker_app.queue("jobs", batch=5, concurrency=5)
    async def job(item: Interaction) -> object:
        seen.add(item.data["n"])
        if len(seen) == 5:
            handled.set()
        return object() if item.data["n"] == 2 else {"n": item.data["n"]}

    transport = httpx.ASGITransport(app=app)
    async with AsyncInteractionsClient("http://mainspring.test", transport=transport) as http:
        worker = Worker(HttpQueues(http, long_poll_ms=50), worker_app, cfg)
        await worker.start()
        try:
            await asyncio.wait_for(handled.wait(), 30)
            for _ in range(300):
                found = [await service.get(store, item["id"]) for item in made]
                if all(f.state in ("completed", "failed") for f in found):
                    break
                await asyncio.sleep(0.05)
        finally:
            await worker.stop(False)
    by_n = {f.data["n"]: f for f in found}
    assert by_n[2].state == "failed" and "cannot be stored as JSON" in (by_n[2].error or ""), by_n[2]
    assert all(by_n[n].state == "completed" and by_n[n].result == {"n": n} for n in (0, 1, 3, 4)), by_n
