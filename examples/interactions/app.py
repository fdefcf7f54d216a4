"""An order that waits for its payment: parent/child interactions with the worker runtime.

    mainspring serve --app examples.interactions.app:app          # handlers inside the server
    mainspring worker examples.interactions.app:app               # or in their own process(es)
    curl http://127.0.0.1:8080/v1/queues/orders/interactions --json '{"data": {"total": 12}}'
    curl "http://127.0.0.1:8080/v1/interactions/ID?wait_ms=10000"    # ID: the "id" the create answered
"""

from __future__ import annotations

import random

from mainspring import App, Fail, HandlerContext, Interaction, Repeat, Wait

app = App()


@app.queue("orders", concurrency=20)
async def order(item: Interaction, ctx: HandlerContext) -> object:
    payments = await ctx.children("payment")
    if not payments:
        await ctx.create_child("payment", queue="payments", data={"amount": item.data["total"]})
        return Wait()  # woken as soon as the payment finishes, completed or failed
    payment = payments[-1]
    if payment["status"] == "failed":
        return Fail(f"payment failed: {payment['error']}")
    return {"paid": payment["result"]}


@app.queue("payments", concurrency=5, timeout_ms=10_000)
def charge(item: Interaction) -> object:
    if random.random() < 0.2:
        raise ConnectionError("the bank did not answer")  # retried after the queue's error_delay_ms
    if random.random() < 0.1:
        return Repeat(in_ms=1000)  # not settled yet: look again in a second
    return {"charged": item.data["amount"]}
