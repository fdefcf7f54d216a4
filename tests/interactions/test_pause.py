"""Pausing a queue: stored in the queue's row, so every server stops leasing from it at once."""

from __future__ import annotations

import asyncio

import httpx

from mainspring.config import Settings
from tests.conftest import eventually
from tests.machines.conftest import server_app


async def _lease(client: httpx.AsyncClient, queue: str, **body: object) -> list[dict[str, object]]:
    reply = await client.post(f"/v1/queues/{queue}/lease", json={"worker": "w", "max": 10, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()["interactions"]  # type: ignore[no-any-return]


async def test_a_paused_queue_leases_nothing_on_any_server_until_resumed(client: httpx.AsyncClient, settings: Settings) -> None:
    await client.post("/v1/queues/pq/interactions", json={"data": 1})
    paused = await client.post("/v1/queues/pq/pause")
    assert paused.status_code == 200 and paused.json()["paused"] is True
    assert (await client.get("/v1/queues/pq")).json()["paused"] is True
    assert await _lease(client, "pq") == []
    async with server_app(settings, background=False) as other:
        assert await _lease(other, "pq") == []
    resumed = await client.post("/v1/queues/pq/resume")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    assert len(await _lease(client, "pq")) == 1


async def test_resuming_wakes_a_worker_waiting_in_a_long_poll(client: httpx.AsyncClient) -> None:
    await client.post("/v1/queues/pw/pause")
    await client.post("/v1/queues/pw/interactions", json={})
    waiting = asyncio.create_task(_lease(client, "pw", wait_ms=10_000))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await client.post("/v1/queues/pw/resume")
    assert len(await asyncio.wait_for(waiting, 5)) == 1


async def test_pause_and_resume_are_events_and_repeating_one_changes_nothing(client: httpx.AsyncClient) -> None:
    await client.post("/v1/queues/pe/pause")
    await client.post("/v1/queues/pe/pause")
    await client.post("/v1/queues/pe/resume")

    async def both() -> list[dict[str, object]] | None:
        found = (await client.get("/v1/events", params={"types": "interaction.queue.*"})).json()["events"]
        return found if len(found) >= 2 else None  # numbered by the sequencer a moment after commit on PostgreSQL

    found = await eventually(both, what="both events")
    assert [(e["type"], e["subject"]) for e in found] == [
        ("interaction.queue.paused", {"kind": "queue", "id": "pe"}),
        ("interaction.queue.resumed", {"kind": "queue", "id": "pe"}),
    ]


async def test_put_queue_settings_keeps_the_queue_paused(client: httpx.AsyncClient) -> None:
    await client.post("/v1/queues/pk/pause")
    reply = await client.put("/v1/queues/pk", json={"concurrency": 3})
    assert reply.json()["paused"] is True and reply.json()["concurrency"] == 3
