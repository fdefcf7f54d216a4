"""An order as a durable workflow: payment, stock, approval by a signal with a timeout, shipping through a
queue, and compensation when it is cancelled.

    mainspring serve --app examples.workflows.orders:app          # the workflow and the shipping queue in the server
    mainspring workflows start orders --id o-1 --args '{"sku": "book-79", "amount": 30}'
    mainspring workflows signal orders o-1 approved --payload '{"by": "ann"}'
    mainspring workflows show orders o-1                          # its steps as a timeline
    mainspring workflows start orders --id o-2 --args '{"sku": "book-80", "amount": 12}'
    mainspring workflows cancel orders o-2                        # the stock is released, the payment refunded

Everything the order does to the outside world is a step, named by ``wf.key`` for that world's idempotency
(a step runs again only when a server died between its return and its record); the shipment is an interaction,
so the queue's limits, owners and priorities apply to it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mainspring import App, Interaction, StepFailed, Workflow

app = App()

APPROVAL_MS = 24 * 3_600_000
"""An order nobody approves within a day is cancelled (and compensated) by itself."""

# The outside world, kept in memory here: a payment provider and a warehouse that take idempotency keys.
LEDGER: dict[str, dict[str, Any]] = {}
STOCK: dict[str, int] = {"book-79": 3, "book-80": 1}


def charge(amount: int, key: str) -> str:
    """Charge the card once per key (a retried charge with the same key is the same charge)."""
    LEDGER.setdefault(key, {"amount": amount, "refunded": False})
    return key


def refund(payment: str) -> None:
    LEDGER[payment]["refunded"] = True


def reserve(sku: str) -> int:
    if STOCK.get(sku, 0) <= 0:
        raise LookupError(f"{sku} is out of stock")
    STOCK[sku] -= 1
    return STOCK[sku]


def release(sku: str) -> None:
    STOCK[sku] = STOCK.get(sku, 0) + 1


@app.queue("shipping", concurrency=5)
async def ship(item: Interaction) -> dict[str, Any]:
    return {"tracking": f"TRK-{item.data['order']}", "sku": item.data["sku"]}


@app.workflow("orders")
async def order(wf: Workflow, args: dict[str, Any]) -> dict[str, Any]:
    payment = await wf.step(lambda: charge(args["amount"], wf.key), name="charge", max_attempts=5, backoff_ms=500)
    try:
        try:
            await wf.step(reserve, args["sku"], name="reserve")
        except StepFailed as out_of_stock:
            await wf.step(refund, payment, name="refund")
            return {"status": "refunded", "reason": out_of_stock.message}
        try:
            approval = await wf.wait("approved", timeout_ms=APPROVAL_MS)
        except TimeoutError:
            await wf.step(release, args["sku"], name="release")
            await wf.step(refund, payment, name="refund")
            return {"status": "expired"}
        shipment = await wf.task("shipping", {"order": wf.id, "sku": args["sku"]}, priority=args.get("priority", 0))
        return {"status": "shipped", "approved_by": approval.get("by"), "tracking": shipment["tracking"]}
    except asyncio.CancelledError:
        # Cancelled while waiting: the stock goes back and the card is refunded, each a recorded step.
        await wf.step(release, args["sku"], name="release")
        await wf.step(refund, payment, name="refund")
        raise
