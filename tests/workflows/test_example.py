"""examples/workflows/orders.py: an order paid, approved and shipped; one cancelled and compensated; one that
nobody approved in time; one out of stock."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from examples.workflows import orders
from mainspring.app import App
from mainspring.store import ManualClock
from tests.workflows.conftest import finished, run_of, until_status


@pytest.fixture
def registry() -> App:
    orders.LEDGER.clear()
    orders.STOCK.update({"book-79": 3, "book-80": 1})
    return orders.app


async def start(client: httpx.AsyncClient, run_id: str, args: dict[str, Any]) -> None:
    assert (await client.post("/v1/workflows/orders/runs", json={"id": run_id, "args": args})).status_code == 201


async def test_an_order_is_paid_reserved_approved_and_shipped_through_the_queue(client: httpx.AsyncClient) -> None:
    await start(client, "o-1", {"sku": "book-79", "amount": 30, "priority": 3})
    await until_status(client, "orders", "o-1", "waiting")
    assert (await client.post("/v1/workflows/orders/runs/o-1/signals/approved", json={"payload": {"by": "ann"}})).status_code == 202
    run = await finished(client, "orders", "o-1")
    assert run["result"] == {"status": "shipped", "approved_by": "ann", "tracking": "TRK-o-1"}
    assert [(s["kind"], s["name"]) for s in run["steps"]] == [
        ("step", "charge"), ("step", "reserve"), ("wait", "approved"), ("signal", "approved"), ("task", "shipping")]
    assert orders.LEDGER == {"wf:orders:o-1:1": {"amount": 30, "refunded": False}} and orders.STOCK["book-79"] == 2


async def test_a_cancelled_order_releases_its_stock_and_refunds_its_payment(client: httpx.AsyncClient) -> None:
    await start(client, "o-2", {"sku": "book-80", "amount": 12})
    await until_status(client, "orders", "o-2", "waiting")
    assert orders.STOCK["book-80"] == 0
    assert (await client.post("/v1/workflows/orders/runs/o-2/cancel")).json()["status"] == "cancelled"
    for _ in range(400):
        run = await run_of(client, "orders", "o-2")
        if [s["name"] for s in run["steps"]][-1:] == ["refund"]:
            break
        await asyncio.sleep(0.05)
    assert orders.STOCK["book-80"] == 1 and orders.LEDGER["wf:orders:o-2:1"]["refunded"]


async def test_an_order_nobody_approves_in_time_is_compensated(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await start(client, "o-3", {"sku": "book-79", "amount": 5})
    await until_status(client, "orders", "o-3", "waiting")
    clock.advance(orders.APPROVAL_MS)
    run = await finished(client, "orders", "o-3")
    assert run["result"] == {"status": "expired"} and orders.STOCK["book-79"] == 3


async def test_an_order_out_of_stock_is_refunded(client: httpx.AsyncClient) -> None:
    orders.STOCK["book-80"] = 0
    await start(client, "o-4", {"sku": "book-80", "amount": 7})
    run = await finished(client, "orders", "o-4")
    assert run["result"] == {"status": "refunded", "reason": "book-80 is out of stock"}
    assert orders.LEDGER["wf:orders:o-4:1"]["refunded"]
