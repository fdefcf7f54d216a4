"""The Python client, sync and async, against a real server process."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from mainspring.client import ProcessorRefused, ServiceUnavailable
from mainspring.client.machines import AsyncMachinesClient, MachinesClient, MachinesError
from mainspring.machines.processor import Unprocessable
from tests.machines.conftest import FakeProcessor, serve_fake


async def test_async_client_drives_a_machine_through_the_api(client: Any, fake: FakeProcessor) -> None:
    async with AsyncMachinesClient("http://mainspring.test", transport=client._transport) as mg:
        created = await mg.start("orders", "m1", {"amount": 3}, idempotency_key="s1")
        assert created["status"] == "working"
        assert await mg.call("orders", "m1", "pay") == {"echo": "pay"}
        assert isinstance(await mg.notify("orders", "m1", "note"), str)
        assert [m["id"] async for m in mg.list("orders", limit=1)] == ["m1"]
        assert (await mg.operation("orders", "m1", "s1"))["status"] == 201
        with pytest.raises(MachinesError) as error:
            await mg.repair("orders", "m1")
        assert error.value.status == 409 and error.value.code == "machine_already_working"
        await mg.remove("orders", "m1")
        with pytest.raises(MachinesError) as error:
            await mg.get("orders", "m1")
        assert error.value.code == "machine_not_found"


@pytest.mark.slow
async def test_sync_client_against_a_real_server_with_an_http_processor(servers: Any) -> None:
    fake = FakeProcessor()
    async with serve_fake(fake) as url:
        (server,) = await asyncio.to_thread(servers, 1)

        def drive() -> dict[str, Any]:
            with MachinesClient(server.url) as mg:
                mg.put_namespace("remote", url=url, timeout_ms=5000)
                mg.start("remote", "m1", "hello")
                assert mg.call("remote", "m1", 1) == {"echo": 1}
                return mg.get("remote", "m1", direction="backward", limit=1)

        body = await asyncio.to_thread(drive)
    assert [e["id"] for e in body["history"]] == [2]


class Counting(httpx.AsyncBaseTransport):
    """Passes requests on to ``transport`` and counts them."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self.transport, self.sent = transport, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return await self.transport.handle_async_request(request)


async def test_a_processor_refusal_raises_processor_refused_which_the_client_does_not_retry(client: Any, fake: FakeProcessor) -> None:
    """422 ``unprocessable`` from the processor is permanent: Start, Call and Repair raise ``ProcessorRefused``,
    not ``ServiceUnavailable`` (which safe calls retry), and a call with an idempotency key is sent once."""

    def refuse(args: Any, machine: Any) -> Any:
        raise Unprocessable(f"no {args}")

    counting = Counting(client._transport)
    async with AsyncMachinesClient("http://mainspring.test", transport=counting, attempts=4, max_wait=0.001) as mg:
        fake.on("init", refuse)
        with pytest.raises(ProcessorRefused) as refused:
            await mg.start("orders", "m1", "tariff", idempotency_key="start-m1")
        assert (refused.value.status, refused.value.code, refused.value.detail) == (502, "processor_refused", "the processor refused: no tariff")
        assert not isinstance(refused.value, ServiceUnavailable)
        assert counting.sent == 1 and fake.kinds() == ["init"]

        fake.handlers.clear()
        await mg.start("orders", "m1")
        fake.on("call", refuse)
        fake.on("repair", refuse)
        with pytest.raises(ProcessorRefused):
            await mg.call("orders", "m1", "pay", idempotency_key="pay-1")
        assert (await mg.get("orders", "m1"))["status"] == "failed"
        with pytest.raises(ProcessorRefused):
            await mg.repair("orders", "m1", idempotency_key="fix-1")
    assert fake.kinds() == ["init", "init", "call", "repair"]
