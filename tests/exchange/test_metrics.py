"""The exchange's gauges at /metrics: processes by state (IN_DOUBT pages someone) and messages waiting per
mailbox, with a bounded number of mailbox series."""

from __future__ import annotations

import pytest

from mainspring.exchange.models import STATES
from mainspring.exchange.watchdog import recover
from tests.core.test_metrics import _scrape, _value
from tests.exchange.conftest import put, start

PR = "/v1/exchange/processes"


def box(database: str) -> str:
    return f"/v1/exchange/mailboxes/mobile-a/{database}"


async def fill(client, database: str, n: int) -> list[str]:
    return [(await put(client, f"{database}-{i}".encode(), mailbox=box(database)))["id"] for i in range(n)]


async def test_processes_by_state_and_messages_waiting_per_mailbox(app, client):
    doubtful = await fill(client, "doubtful", 1)
    pid = (await start(client, doubtful, mailbox=box("doubtful"))).json()["id"]
    await client.post(f"{PR}/{pid}/ready")
    await recover(app.state.context)  # READY_TO_COMMIT at start-up → IN_DOUBT
    await fill(client, "orders", 3)
    taken = await fill(client, "busy", 2)
    assert (await start(client, taken[:1], mailbox=box("busy"))).status_code == 201
    committed = await fill(client, "done", 1)
    pid = (await start(client, committed, mailbox=box("done"))).json()["id"]
    await client.post(f"{PR}/{pid}/ready")
    assert (await client.post(f"{PR}/{pid}/committed")).json()["state"] == "DONE"

    text = await _scrape(client)
    counts = {state: _value(text, "mainspring_exchange_processes", state=state) for state in STATES}
    assert counts == {"STARTED": 1, "READY_TO_COMMIT": 0, "CLEANUP": 0, "DONE": 1, "CANCELLED": 0, "ABORTED": 0,
                      "IN_DOUBT": 1}
    assert _value(text, "mainspring_exchange_messages_waiting", mailbox="mobile-a/orders") == 3
    assert _value(text, "mainspring_exchange_messages_waiting", mailbox="mobile-a/busy") == 1
    # Neither taken, quarantined nor committed messages wait; a mailbox with none has no series.
    assert _value(text, "mainspring_exchange_messages_waiting", mailbox="mobile-a/doubtful") is None
    assert _value(text, "mainspring_exchange_messages_waiting", mailbox="mobile-a/done") is None
    assert _value(text, "mainspring_exchange_messages_waiting", mailbox="_other") is None


@pytest.fixture
def settings(settings):
    settings.exchange.metrics_max_mailboxes = 2
    return settings


async def test_mailboxes_past_the_limit_are_summed_under_other(client):
    for database, n in (("big", 4), ("middle", 3), ("small", 2), ("tiny", 1)):
        await fill(client, database, n)
    text = await _scrape(client)
    waiting = [line for line in text.splitlines() if line.startswith("mainspring_exchange_messages_waiting{")]
    assert len(waiting) == 3
    assert _value(text, "mainspring_exchange_messages_waiting", mailbox="mobile-a/big") == 4
    assert _value(text, "mainspring_exchange_messages_waiting", mailbox="mobile-a/middle") == 3
    assert _value(text, "mainspring_exchange_messages_waiting", mailbox="_other") == 3
