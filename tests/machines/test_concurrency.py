"""Two servers on one database, timer precision on the real clock."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from mainspring.app import App, Registration
from mainspring.config import Settings
from mainspring.store import format_time
from tests.machines.conftest import FakeProcessor, eventually, server_app

BASE = "/v1/namespaces/orders/machines"


async def test_two_servers_racing_on_one_machine_never_both_append(settings: Settings) -> None:
    fake = FakeProcessor()

    async def slow_call(args: Any, machine: Any) -> Any:
        await asyncio.sleep(random.uniform(0, 0.01))
        return {"events": [{"call": args}], "response": args}

    async def slow_notification(args: Any, machine: Any) -> Any:
        await asyncio.sleep(random.uniform(0, 0.01))
        return {"events": [{"notification": args}]}

    fake.on("call", slow_call)
    fake.on("notification", slow_notification)
    registry = App()
    registry.processors["orders"] = Registration(fake)
    async with server_app(settings, registry) as a, server_app(settings, registry) as b:
        assert (await a.post(BASE, json={"id": "m1"})).status_code == 201
        servers = [a, b]
        calls = [servers[i % 2].post(f"{BASE}/m1/call", json={"args": i}) for i in range(40)]
        notes = [servers[i % 2].post(f"{BASE}/m1/notifications", json={"args": i}) for i in range(20)]
        replies = await asyncio.gather(*calls, *notes)
        ok_calls = [i for i, r in enumerate(replies[:40]) if r.status_code == 200]
        assert all(r.status_code in (200, 409) for r in replies[:40])
        assert all(r.status_code == 202 for r in replies[40:])

        async def settled() -> Any:
            body = (await a.get(f"{BASE}/m1")).json()
            return body if body["pending_notifications"] == 0 else None

        body = await eventually(settled, within_s=90)
    ids = [e["id"] for e in body["history"]]
    assert ids == list(range(1, len(ids) + 1))
    data = [e["data"] for e in body["history"][1:]]
    assert sorted(d["call"] for d in data if "call" in d) == ok_calls
    assert [d["notification"] for d in data if "notification" in d] == list(range(20)) or sorted(
        d["notification"] for d in data if "notification" in d
    ) == list(range(20))
    # A call that kept losing the version race is refused (409 machine_busy) and appended nothing.
    assert all(r.json()["code"] == "machine_busy" for r in replies[:40] if r.status_code == 409)
    assert len(ok_calls) >= 20


async def test_timer_fires_within_50_ms_of_its_due_time(settings: Settings) -> None:
    """Timers are leased a little ahead and fired on the due millisecond of the real clock.

    The machine running the tests is shared, and when it is overloaded the OS may not run this process for
    longer than 50 ms at all. The test measures that starvation (how late a 5 ms sleep wakes) and allows it on
    top of the 50 ms budget, so it measures the server and not the neighbours: on an idle machine it is 50 ms.
    """
    starvation = [0.0]
    measuring = True

    async def measure_starvation() -> None:
        while measuring:
            started = time.perf_counter()
            await asyncio.sleep(0.005)
            starvation[0] = max(starvation[0], (time.perf_counter() - started - 0.005) * 1000)

    meter = asyncio.create_task(measure_starvation())
    fake = FakeProcessor()
    lateness: list[int] = []

    def set_timer(args: Any, machine: Any) -> Any:
        return {"aux_state": {"due": args}, "action": {"timer": {"at": format_time(args)}}}

    def timeout(args: Any, machine: Any) -> Any:
        lateness.append(time.time_ns() // 1_000_000 - machine["aux_state"]["due"])
        return {"events": ["fired"]}

    fake.on("call", set_timer)
    fake.on("timeout", timeout)
    registry = App()
    registry.processors["orders"] = Registration(fake)
    async with server_app(settings, registry) as server:
        for i in range(10):
            await server.post(BASE, json={"id": f"m{i}"})
        # Due well after the set-up, however slow this shared machine is right now.
        base = time.time_ns() // 1_000_000 + 3000
        for i in range(10):
            await server.post(f"{BASE}/m{i}/call", json={"args": base + 120 * i})

        async def all_fired() -> bool:
            return len(lateness) == 10

        await eventually(all_fired)
    measuring = False
    await meter
    assert min(lateness) >= 0, lateness
    assert max(lateness) <= 50 + starvation[0], (lateness, starvation[0])
