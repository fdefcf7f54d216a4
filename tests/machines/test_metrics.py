"""The machines face's business metrics at /metrics, per namespace (never per machine id)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from mainspring.machines.processor import Unprocessable
from mainspring.store import ManualClock
from tests.core.test_metrics import _scrape, _value
from tests.machines.conftest import NS, FakeProcessor, eventually
from tests.machines.test_seed_lifecycle import BASE, _status


def refuse(args: Any, machine: Any) -> Any:
    raise Unprocessable("cannot")


async def test_machines_are_counted_by_namespace_and_status(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    fake.on("call", refuse)
    for machine_id in ("a", "b", "c"):
        await client.post(BASE, json={"id": machine_id})
    await client.post(f"{BASE}/c/call", json={})
    text = await _scrape(client)
    assert _value(text, "mainspring_machines", namespace=NS, status="working") == 2
    assert _value(text, "mainspring_machines", namespace=NS, status="failed") == 1
    machine_lines = [line for line in text.splitlines() if line.startswith("mainspring_machines")]
    assert machine_lines and not any('"a"' in line or "id=" in line for line in machine_lines), "labels are namespaces, never ids"


async def test_steps_and_processor_errors_are_counted_by_namespace_and_kind(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    before = await _scrape(client)
    steps_before = _value(before, "mainspring_machines_steps_total", namespace=NS, kind="call") or 0
    errors_before = _value(before, "mainspring_machines_processor_errors_total", namespace=NS, kind="call", code="processor_failed") or 0
    await client.post(BASE, json={"id": "m1"})
    await client.post(f"{BASE}/m1/call", json={})
    await client.post(f"{BASE}/m1/call", json={})
    fake.on("call", lambda a, m: (_ for _ in ()).throw(ConnectionError("down")))
    assert (await client.post(f"{BASE}/m1/call", json={})).status_code == 502
    after = await _scrape(client)
    assert _value(after, "mainspring_machines_steps_total", namespace=NS, kind="call") == steps_before + 2
    assert (_value(after, "mainspring_machines_steps_total", namespace=NS, kind="init") or 0) >= 1
    assert _value(after, "mainspring_machines_processor_errors_total", namespace=NS, kind="call", code="processor_failed") == errors_before + 1


async def test_a_due_timer_not_yet_fired_is_a_backlog_and_its_lateness_is_observed(
    client: httpx.AsyncClient, fake: FakeProcessor, clock: ManualClock
) -> None:
    release = asyncio.Event()

    async def slow_timeout(args: Any, machine: Any) -> Any:
        await release.wait()
        return {"events": ["fired"]}

    fake.on("init", lambda a, m: {"action": {"timer": {"in_ms": 1000}}})
    fake.on("timeout", slow_timeout)
    before = _value(await _scrape(client), "mainspring_machines_timer_lateness_seconds_count", namespace=NS) or 0
    await client.post(BASE, json={"id": "t1"})
    clock.advance(3000)  # the timer is now 2 s overdue, and its processor call hangs until released

    async def in_backlog() -> str | None:
        text = await _scrape(client)
        return text if _value(text, "mainspring_machines_due_timers", namespace=NS) == 1 else None

    text = await eventually(in_backlog, what="a due timer in the backlog")
    assert (_value(text, "mainspring_machines_oldest_due_timer_seconds", namespace=NS) or 0) >= 2
    await eventually(lambda: asyncio.sleep(0, bool(fake.kinds().count("timeout"))), what="the timer fired")
    release.set()
    await eventually(lambda: _status(client, "t1", "working"))

    async def drained() -> str | None:
        text = await _scrape(client)
        return text if _value(text, "mainspring_machines_due_timers", namespace=NS) is None else None

    text = await eventually(drained, what="the backlog drained")
    assert _value(text, "mainspring_machines_timer_lateness_seconds_count", namespace=NS) == before + 1
    assert (_value(text, "mainspring_machines_timer_lateness_seconds_sum", namespace=NS) or 0) >= 2
