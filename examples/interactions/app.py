"""An order that waits for its payment: parent/child interactions with the worker runtime.

    mainspring serve --app examples.interactions.app:app          # handlers inside the server
    mainspring worker examples.interactions.app:app               # or in their own process(es)
    curl -X POST localhost:8080/v1/queues/orders/interactions -d '{"data": {"total": 12}}'
    curl "localhost:8080/v1/interactions/1?wait_ms=10000"
"""

from __future__ import annotations

import random
from typing import Any

from mainspring.app import App
from mainspring.interactions import Fail, Repeat, Wait

app = App()


@app.queue("orders", concurrency=20)
async def order(item: Any, ctx: Any) -> Any:
    payments = await ctx.children("payment")
    if not payments:
        await ctx.create_child("payment", queue="payments", data={"amount": item.data["total"]})
        return Wait()  # woken as soon as the payment finishes, completed or failed
    payment = payments[-1]
    if payment["status"] == "failed":
        return Fail(f"payment failed: {payment['error']}")
    return {"paid": payment["result"]}


@app.queue("payments", concurrency=5, timeout_ms=10_000)
def charge(item: Any) -> Any:
    if random.random() < 0.2:
        raise ConnectionError("the bank did not answer")  # retried after the queue's error_delay_ms
    if random.random() < 0.1:
        return Repeat(in_ms=1000)  # not settled yet: look again in a second
    return {"charged": item.data["amount"]}
