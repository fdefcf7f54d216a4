"""Seed 001 «Внутренний сбой управляющей машины» and «Восстановление после внутреннего сбоя»:
a server killed mid-step loses nothing, and a restarted server resumes all unfinished work by itself."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import httpx
import pytest

from mainspring.app import App, Registration
from mainspring.config import Settings
from tests.machines.conftest import FakeProcessor, eventually, serve_fake, server_app

BASE = "/v1/namespaces/orders/machines"


async def test_restarted_server_resumes_due_timers_and_pending_notifications(settings: Settings) -> None:
    fake = FakeProcessor()
    fake.on("init", lambda a, m: {"events": ["created"], "action": {"timer": {"in_ms": 0}}})
    fake.on("notification", lambda a, m: {"events": [a]})
    registry = App()
    registry.processors["orders"] = Registration(fake)
    async with server_app(settings, registry, background=False) as before_crash:
        for machine_id in ("a", "b"):
            assert (await before_crash.post(BASE, json={"id": machine_id})).status_code == 201
            for i in range(3):
                assert (await before_crash.post(f"{BASE}/{machine_id}/notifications", json={"args": i})).status_code == 202
    assert fake.kinds() == ["init", "init"]
    async with server_app(settings, registry) as after_restart:

        async def resumed() -> Any:
            bodies = [(await after_restart.get(f"{BASE}/{m}")).json() for m in ("a", "b")]
            return bodies if all(len(b["history"]) == 5 for b in bodies) else None

        bodies = await eventually(resumed)
    for body in bodies:
        assert body["history"][1]["data"] == "timed out"
        assert [e["data"] for e in body["history"][2:]] == [0, 1, 2]
        assert body["timer"] is None and body["pending_notifications"] == 0


@pytest.mark.slow
async def test_server_killed_between_processor_answer_and_commit_redoes_the_step_once(servers: Any) -> None:
    fake = FakeProcessor()
    fake.on("init", lambda a, m: {"events": ["created"], "action": {"timer": {"in_ms": 300}}})
    victim: list[Any] = []

    def timeout(args: Any, machine: Any) -> Any:
        if len([k for k in fake.kinds() if k == "timeout"]) == 1:
            # The processor has its answer; the server dies before it can commit it.
            os.kill(victim[0].proc.pid, signal.SIGKILL)
        return {"events": ["expired"], "aux_state": "paid"}

    fake.on("timeout", timeout)
    env = {"MAINSPRING_MACHINES__LEASE_MARGIN_MS": "300"}
    async with serve_fake(fake) as url:
        (first,) = await asyncio.to_thread(servers, 1, env)
        victim.append(first)
        async with httpx.AsyncClient(base_url=first.url, timeout=10) as client:
            await client.put("/v1/namespaces/orders", json={"processor": {"url": url, "timeout_ms": 1000}})
            assert (await client.post(BASE, json={"id": "m1"})).status_code == 201

        async def killed() -> bool:
            return first.proc.poll() is not None

        await eventually(killed)
        (second,) = await asyncio.to_thread(servers, 1, env)
        async with httpx.AsyncClient(base_url=second.url, timeout=10) as client:

            async def redone() -> Any:
                body = (await client.get(f"{BASE}/m1")).json()
                return body if len(body["history"]) == 2 else None

            body = await eventually(redone, within_s=20)
            await asyncio.sleep(1.5)  # longer than a lease: nothing fires a third time
            body = (await client.get(f"{BASE}/m1")).json()
    assert [e["data"] for e in body["history"]] == ["created", "expired"]
    assert [e["id"] for e in body["history"]] == [1, 2]
    assert body["aux_state"] == "paid" and body["timer"] is None
    assert fake.kinds().count("timeout") == 2
