"""A publisher that keeps failing (a broker down, a module missing) raises one alert an administrator sees, not
one per retry, and keeps retrying."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from mainspring.config import Settings
from mainspring.core import alerts, outbox
from mainspring.core.publishers import run_publisher
from mainspring.core.runtime import Context
from mainspring.store import Store


class BrokenSink:
    name = "kafka:orders"

    def __init__(self) -> None:
        self.attempts = 0
        self.retried = asyncio.Event()

    async def publish(self, events: Sequence[dict[str, Any]]) -> None:
        self.attempts += 1
        if self.attempts >= 3:
            self.retried.set()
        raise ConnectionRefusedError("kafka1:9092 refused the connection")

    async def close(self) -> None:
        pass


async def test_a_failing_publisher_raises_one_alert_and_keeps_retrying(settings: Settings, store: Store) -> None:
    async with store.transaction() as tx:
        await outbox.emit_many(tx, [outbox.Event("order.placed", "order", "o-1", {})])
    ctx = Context(settings=settings, store=store)
    sink = BrokenSink()
    running = asyncio.create_task(run_publisher(ctx, sink, ["order.placed"]))
    try:
        async with asyncio.timeout(30):
            await sink.retried.wait()
    finally:
        ctx.stopping.set()
        await running
    found, _ = await alerts.list_alerts(store, open_only=True, limit=100, cursor=None)
    failing = [a for a in found if a["code"] == "publisher_failing"]
    assert len(failing) == 1, found
    assert failing[0]["subject"] == {"kind": "publisher", "id": "kafka:orders"}
    assert "refused the connection" in failing[0]["detail"]
