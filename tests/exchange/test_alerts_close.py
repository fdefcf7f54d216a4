"""Exchange alerts close themselves once their subject is fixed, with who, when and why recorded."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mainspring.config import Settings
from mainspring.store import ManualClock
from tests.conftest import eventually
from tests.exchange.conftest import COMMIT_TIMEOUT_MS, put, settle, start

P = "/v1/exchange/processes"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The exchange tests' settings, with the alert closer looking every 50 ms."""
    return settings.model_copy(update={"server": settings.server.model_copy(update={"alerts_check_interval_ms": 50})})


async def _in_doubt(app: Any, client: httpx.AsyncClient, clock: ManualClock) -> str:
    message = await put(client, b"order")
    process = (await start(client, [message["id"]])).json()
    await client.post(f"{P}/{process['id']}/ready")
    clock.advance(COMMIT_TIMEOUT_MS)
    await settle(app)
    return str(process["id"])


async def _alert(client: httpx.AsyncClient, code: str, subject_id: str, *, open_only: bool) -> dict[str, Any] | None:
    found = (await client.get("/v1/alerts", params={"open": str(open_only).lower(), "limit": 100})).json()["alerts"]
    return next((a for a in found if a["code"] == code and a["subject"]["id"] == subject_id), None)


@pytest.mark.parametrize("committed", [True, False])
async def test_an_in_doubt_alert_closes_itself_once_the_process_is_resolved(app: Any, client: httpx.AsyncClient, clock: ManualClock, committed: bool) -> None:
    pid = await _in_doubt(app, client, clock)
    assert await _alert(client, "exchange_in_doubt", pid, open_only=True) is not None
    assert (await client.post(f"{P}/{pid}/resolve", json={"committed": committed})).status_code == 200

    async def closed() -> dict[str, Any] | None:
        alert = await _alert(client, "exchange_in_doubt", pid, open_only=False)
        return alert if alert and alert["resolved_at"] else None

    alert = await eventually(closed, what="the alert closed")
    assert alert["resolved_by"] == "mainspring" and alert["resolution"].startswith("IN_DOUBT resolved: the process is ")
    assert alert["acked_at"] is None
    assert await _alert(client, "exchange_in_doubt", pid, open_only=True) is None


async def test_an_in_doubt_alert_stays_open_while_the_process_is_in_doubt(app: Any, client: httpx.AsyncClient, clock: ManualClock) -> None:
    from mainspring.api import FACES
    from mainspring.core.alerts import close_fixed_alerts

    pid = await _in_doubt(app, client, clock)
    checks = {code: check for face in FACES for code, check in face.fixed_alerts.items()}
    assert await close_fixed_alerts(app.state.context.store, checks) == 0
    assert await _alert(client, "exchange_in_doubt", pid, open_only=True) is not None
