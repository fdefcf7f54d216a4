"""Regression tests for bugs the chaos runs found in the faces.

- The exchange client read every message body after API_2 but started heartbeating only afterwards, so a
  batch whose bodies took longer than process_timeout_ms to read was always CANCELLED and taken again the
  same way: a livelock under load with short deadlines."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from mainspring.client.exchange import AsyncExchangeClient, ExchangeProcessor
from mainspring.config import Settings, load_settings
from mainspring.store import ManualClock
from tests.chaos.workloads import apply_to_erp, erp_metadata

PROCESS_TIMEOUT_MS = 1000


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 200, "sqlite_synchronous": "NORMAL"},
        exchange={"process_timeout_ms": PROCESS_TIMEOUT_MS, "commit_timeout_ms": 20_000, "watchdog_interval_ms": 50},
    )


class SlowBodies(httpx.AsyncBaseTransport):
    """Each message-body read takes 0.3 s of real time and 400 ms of the server's clock (a slow link)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, clock: ManualClock) -> None:
        self.inner = inner
        self.clock = clock

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and "/messages/" in request.url.path:
            await asyncio.sleep(0.3)
            self.clock.advance(400)
            await asyncio.sleep(0.05)  # let the watchdog look
        return await self.inner.handle_async_request(request)


async def test_exchange_helper_keeps_its_process_alive_while_reading_bodies(app: Any, client: httpx.AsyncClient,
                                                                             clock: ManualClock, tmp_path: Path) -> None:
    for n in range(4):
        stored = await client.post("/v1/exchange/mailboxes/erp/db1/messages", content=json.dumps({"key": f"x{n}"}).encode())
        assert stored.status_code == 201, stored.text
    erp = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'erp.db'}")
    exchange = AsyncExchangeClient("http://mainspring.test", transport=SlowBodies(httpx.ASGITransport(app=app), clock))
    try:
        async with erp.begin() as conn:
            await conn.run_sync(erp_metadata.create_all)
        worker = ExchangeProcessor(exchange, erp, addressee="erp", database="db1", client_id="erp-1",
                                   handler=apply_to_erp, heartbeat_s=0.1)
        await worker.ensure_marker_table()
        outcome = await worker.process_once()
        assert outcome.status == "committed", outcome
    finally:
        await exchange.aclose()
        await erp.dispose()
