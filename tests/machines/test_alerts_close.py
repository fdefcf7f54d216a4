"""A machine_failed alert closes itself once the machine works again (or is removed)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mainspring.config import Settings
from mainspring.machines.processor import Unprocessable
from tests.machines.conftest import NS, FakeProcessor, eventually
from tests.machines.test_seed_lifecycle import BASE


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The machines tests' settings, with the alert closer looking every 50 ms."""
    return settings.model_copy(update={"server": settings.server.model_copy(update={"alerts_check_interval_ms": 50})})


def refuse(args: Any, machine: Any) -> Any:
    raise Unprocessable("cannot")


async def _alerts(client: httpx.AsyncClient, machine_id: str, *, open_only: bool) -> list[dict[str, Any]]:
    found = (await client.get("/v1/alerts", params={"open": str(open_only).lower(), "limit": 100})).json()["alerts"]
    return [a for a in found if a["code"] == "machine_failed" and a["subject"]["id"] == f"{NS}/{machine_id}"]


async def _failed(client: httpx.AsyncClient, fake: FakeProcessor, machine_id: str) -> None:
    fake.on("call", refuse)
    await client.post(BASE, json={"id": machine_id})
    assert (await client.post(f"{BASE}/{machine_id}/call", json={})).status_code == 502
    assert len(await _alerts(client, machine_id, open_only=True)) == 1


async def _closed(client: httpx.AsyncClient, machine_id: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        found = [a for a in await _alerts(client, machine_id, open_only=False) if a["resolved_at"]]
        return found[0] if found else None

    return await eventually(check, what="the alert closed")  # type: ignore[no-any-return]


@pytest.mark.parametrize("simple", [True, False])
async def test_a_machine_failed_alert_closes_itself_when_the_machine_is_repaired(client: httpx.AsyncClient, fake: FakeProcessor, simple: bool) -> None:
    await _failed(client, fake, "m1")
    assert (await client.post(f"{BASE}/m1/repair", json={"simple": simple})).status_code == 200
    alert = await _closed(client, "m1")
    assert (alert["resolved_by"], alert["resolution"]) == ("mainspring", "machine repaired")
    assert await _alerts(client, "m1", open_only=True) == []

    async def resolved_event() -> list[dict[str, Any]]:
        return [e for e in (await client.get("/v1/events", params={"types": "alert.resolved"})).json()["events"] if e["subject"]["id"] == f"{NS}/m1"]

    [event] = await eventually(resolved_event, what="alert.resolved")
    assert event["data"]["alert_id"] == alert["id"] and event["data"]["resolution"] == "machine repaired"


async def test_a_machine_failed_alert_closes_itself_when_the_machine_is_removed(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await _failed(client, fake, "m2")
    assert (await client.delete(f"{BASE}/m2")).status_code == 204
    assert (await _closed(client, "m2"))["resolution"] == "machine removed"


async def test_a_machine_that_fails_again_after_its_alert_closed_gets_a_new_alert(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    await _failed(client, fake, "m3")
    await client.post(f"{BASE}/m3/repair", json={"simple": True})
    await _closed(client, "m3")
    assert (await client.post(f"{BASE}/m3/call", json={})).status_code == 502
    assert len(await _alerts(client, "m3", open_only=True)) == 1
