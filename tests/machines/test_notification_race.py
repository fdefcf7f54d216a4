"""Notifications delivered by two servers while both also run calls on the same machines.

The notification queue of a machine is written by Notify (insert), by delivery steps (delete the head, applied
under the version guard) and by failed deliveries (reschedule the head); calls move the version on and end
the background lease in between. Whatever interleaves, each acknowledged notification is, at every moment a
client looks, either still pending or in the history — once, in order — never both and never neither.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from mainspring.app import App, Registration
from mainspring.config import Settings
from tests.machines.conftest import FakeProcessor, eventually, server_app

BASE = "/v1/namespaces/orders/machines"
MACHINES = 3
NOTIFICATIONS = 20
CALLS = 20


@dataclass
class Sent:
    """Per machine: notifications whose request went out, and those answered 202."""

    requested: int = 0
    acknowledged: int = 0
    violations: list[str] = field(default_factory=list)


async def with_retries(server: Any, url: str, n: int, key: str) -> Any:
    """POST as a client does: a 503 (the store aborted the transaction) is sent again with the same key."""
    while True:
        reply = await server.post(url, json={"args": n}, headers={"Idempotency-Key": key})
        if reply.status_code != 503:
            return reply
        await asyncio.sleep(0.01)


def delivered(body: dict[str, Any]) -> list[int]:
    return [e["data"]["notification"] for e in body["history"] if isinstance(e["data"], dict) and "notification" in e["data"]]


@pytest.mark.timeout(300)  # a loaded machine runs two servers' worth of steps slowly
async def test_every_get_shows_each_acknowledged_notification_pending_or_delivered_while_two_servers_race(settings: Settings) -> None:
    fake = FakeProcessor()

    async def call(args: Any, machine: Any) -> Any:
        await asyncio.sleep(random.uniform(0, 0.002))
        return {"events": [{"call": args}], "response": args}

    async def notification(args: Any, machine: Any) -> Any:
        await asyncio.sleep(random.uniform(0, 0.002))
        return {"events": [{"notification": args}]}

    fake.on("call", call)
    fake.on("notification", notification)
    registry = App()
    registry.processors["orders"] = Registration(fake)
    ids = [f"m{i}" for i in range(MACHINES)]
    sent = {machine_id: Sent() for machine_id in ids}
    async with server_app(settings, registry) as a, server_app(settings, registry) as b:
        servers = [a, b]
        for machine_id in ids:
            assert (await a.post(BASE, json={"id": machine_id})).status_code == 201

        async def notify(machine_id: str, n: int) -> None:
            sent[machine_id].requested += 1
            reply = await with_retries(servers[n % 2], f"{BASE}/{machine_id}/notifications", n, f"notify-{n}")
            assert reply.status_code == 202, reply.text
            sent[machine_id].acknowledged += 1

        async def notify_in_order(machine_id: str) -> None:
            # One after another, so that "delivered in order" has a meaning to check.
            for n in range(NOTIFICATIONS):
                await notify(machine_id, n)

        async def calls(machine_id: str) -> list[int]:
            replies = await asyncio.gather(*(with_retries(servers[n % 2], f"{BASE}/{machine_id}/call", n, f"call-{n}") for n in range(CALLS)))
            assert all(r.status_code in (200, 409) for r in replies), [r.text for r in replies if r.status_code not in (200, 409)]
            return [n for n, r in enumerate(replies) if r.status_code == 200]

        async def watch(machine_id: str, server: Any) -> None:
            """Read the machine over and over; every view must account for each acknowledged notification."""
            state = sent[machine_id]
            while True:
                low = state.acknowledged
                body = (await server.get(f"{BASE}/{machine_id}")).json()
                high = state.requested
                seen = delivered(body)
                if seen != list(range(len(seen))):
                    state.violations.append(f"{machine_id}: delivered out of order or twice: {seen}")
                accounted = len(seen) + body["pending_notifications"]
                if not low <= accounted <= high:
                    state.violations.append(
                        f"{machine_id}: {len(seen)} delivered + {body['pending_notifications']} pending, "
                        f"but {low}..{high} were acknowledged (history up to event {body['last_event_id']})"
                    )
                if low == NOTIFICATIONS and body["pending_notifications"] == 0:
                    return
                await asyncio.sleep(0.01)

        watchers = [asyncio.create_task(watch(machine_id, server)) for machine_id in ids for server in servers]
        results = await asyncio.gather(*(notify_in_order(m) for m in ids), *(calls(m) for m in ids))
        ok_calls = dict(zip(ids, results[MACHINES:], strict=True))
        await eventually(lambda: asyncio.sleep(0, all(w.done() for w in watchers)), within_s=90, what="every notification delivered")
        await asyncio.gather(*watchers)
        finals = {machine_id: (await b.get(f"{BASE}/{machine_id}")).json() for machine_id in ids}
    violations = [v for state in sent.values() for v in state.violations]
    assert not violations, violations[:10]
    for machine_id, body in finals.items():
        events = [e["id"] for e in body["history"]]
        assert events == list(range(1, len(events) + 1))
        assert delivered(body) == list(range(NOTIFICATIONS))
        assert sorted(e["data"]["call"] for e in body["history"] if isinstance(e["data"], dict) and "call" in e["data"]) == ok_calls[machine_id]
