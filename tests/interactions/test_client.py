"""The Python client against the app (async client over the ASGI transport)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mainspring.client.interactions import AsyncInteractionsClient, InteractionsError


async def test_python_client_creates_leases_and_releases(app: Any) -> None:
    client = AsyncInteractionsClient("http://mainspring.test", transport=httpx.ASGITransport(app=app))
    async with client:
        await client.put_queue("q", concurrency=5)
        item = await client.create("q", data={"x": 1}, message_id="m1")
        assert (await client.create("q", message_id="m1"))["id"] == item["id"]
        [held] = (await client.lease("q", worker="w", max=5))["interactions"]
        done = await client.release(held["id"], held["lease"]["token"], {"complete": {"result": 2}})
        assert done["status"] == "completed"
        with pytest.raises(InteractionsError) as lost:
            await client.release(held["id"], held["lease"]["token"], {"complete": {}})
        assert lost.value.code == "lease_lost"
        many = await client.create_many("q", [{"data": i} for i in range(3)])
        assert [i["data"] for i in many] == [0, 1, 2]


async def test_python_client_pauses_and_resumes_a_queue(app: Any) -> None:
    client = AsyncInteractionsClient("http://mainspring.test", transport=httpx.ASGITransport(app=app))
    async with client:
        await client.create("pc", data=1)
        assert (await client.pause_queue("pc"))["paused"] is True
        assert (await client.lease("pc", worker="w", max=5))["interactions"] == []
        assert (await client.resume_queue("pc"))["paused"] is False
        assert len((await client.lease("pc", worker="w", max=5))["interactions"]) == 1
