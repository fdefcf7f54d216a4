from __future__ import annotations

from typing import Any

import httpx

from mainspring import App, Workflow


async def test_a_run_of_two_steps_completes_with_its_result(registry: App, client: httpx.AsyncClient) -> None:
    calls: list[str] = []

    async def reserve(sku: str) -> dict[str, Any]:
        calls.append("reserve")
        return {"sku": sku, "ok": True}

    def charge(amount: int) -> int:
        calls.append("charge")
        return amount * 2

    @registry.workflow("orders")
    async def order(wf: Workflow, args: Any) -> Any:
        stock = await wf.step(reserve, args["sku"])
        paid = await wf.step(charge, 21)
        return {"stock": stock, "paid": paid}

    started = await client.post("/v1/workflows/orders/runs", json={"id": "o1", "args": {"sku": "A"}})
    assert started.status_code == 201, started.text
    run = (await client.get("/v1/workflows/orders/runs/o1", params={"wait_ms": 10_000})).json()
    assert run["status"] == "completed", run
    assert run["result"] == {"stock": {"sku": "A", "ok": True}, "paid": 42}
    assert [s["name"] for s in run["steps"]] == ["reserve", "charge"]
    assert calls == ["reserve", "charge"]
