"""The worked example of docs/machines.md (examples/machines/invoices.py) does what the page says."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import httpx

from mainspring.app import App
from mainspring.store import ManualClock
from tests.machines.conftest import eventually

EXAMPLE = Path(__file__).parents[2] / "examples" / "machines" / "invoices.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("invoices_example", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_invoice_is_issued_paid_in_parts_and_reminded_when_overdue(registry: App, client: httpx.AsyncClient, clock: ManualClock) -> None:
    example = load_example()
    registry.processors.update(example.app.processors)
    base = "/v1/namespaces/invoices/machines"
    assert (await client.post(base, json={"id": "bad", "args": {"amount": 0}})).status_code == 502
    assert (await client.post(base, json={"id": "inv-1", "args": {"amount": 100}})).status_code == 201
    assert (await client.post(f"{base}/inv-1/call", json={"args": {"amount": 60}})).json() == {"response": {"paid": 60}}
    clock.advance(14 * example.DAY_MS)

    async def overdue() -> Any:
        body = (await client.get(f"{base}/inv-1")).json()
        return body if body["history"][-1]["data"] == "overdue" else None

    await eventually(overdue)
    assert (await client.post(f"{base}/inv-1/call", json={"args": {"amount": 40}})).json() == {"response": {"paid": 100}}
    body = (await client.get(f"{base}/inv-1")).json()
    assert [e["data"] for e in body["history"]][-2:] == [{"paid": 40}, "settled"]
    assert body["timer"] is None
