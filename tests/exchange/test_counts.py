"""Processes and messages by state (issue 26): kept with the writes (migration exchange_0003, ``store.counts``),
so the overview reads them without counting the rows — and exact through every state change and retention's
removal: each step compares them with a count of the rows themselves."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from mainspring.exchange import data
from mainspring.exchange.tables import exchange_counts
from mainspring.exchange.tables import exchange_messages as M
from mainspring.exchange.tables import exchange_processes as P
from mainspring.exchange.watchdog import recover
from tests.conftest import assert_counts_exact
from tests.exchange.test_retention import RETENTION_MS, aborted, done, ready, remove_all, started


@pytest.fixture
def settings(settings):
    settings.exchange.finished_retention_ms = RETENTION_MS
    settings.exchange.process_timeout_ms = settings.exchange.commit_timeout_ms = 100 * RETENTION_MS
    return settings


async def exact(store) -> dict[str, dict[str, int]]:
    """Both kinds checked against their rows, and the available messages of every mailbox; answers what the
    overview shows."""
    await assert_counts_exact(store, exchange_counts, "processes", P, "state")
    await assert_counts_exact(store, exchange_counts, "messages", M, "state", group=("addressee", "database"))
    async with store.read() as conn:
        waiting = (await conn.execute(select(M.c.addressee, M.c.database, func.count()).where(M.c.state == "AVAILABLE")
                                      .group_by(M.c.addressee, M.c.database))).all()
        assert await data.available_by_mailbox(conn) == {(a, d): n for a, d, n in waiting}
        return await data.count_by_state(conn)


async def test_process_and_message_counts_stay_exact_through_every_state_and_retention(app, client, clock, store):
    _, live = await started(client, "started")
    assert (await exact(store))["processes"] == {"STARTED": 1}
    _, readied = await started(client, "ready")
    await ready(client, readied)
    await done(client, "done", reply_to="receipts")
    await aborted(client, "aborted")
    counted = await exact(store)
    assert counted["processes"] == {"STARTED": 1, "READY_TO_COMMIT": 1, "DONE": 1, "ABORTED": 1}

    clock.advance(RETENTION_MS + 1)
    await remove_all(app.state.context)  # retention deletes the finished processes and their messages
    counted = await exact(store)
    assert counted["processes"] == {"STARTED": 1, "READY_TO_COMMIT": 1}
    assert (await client.get(f"/v1/exchange/processes/{live}")).json()["state"] == "STARTED"


async def test_quarantined_messages_of_a_process_in_doubt_are_counted_in_their_mailbox(app, client, store):
    _ids, pid = await started(client, "doubted", n=3)
    await ready(client, pid)
    await recover(app.state.context)  # a process that said ready is in doubt after a restart
    counted = await exact(store)
    assert counted["processes"] == {"IN_DOUBT": 1} and counted["messages"] == {"QUARANTINED": 3}
    async with store.read() as conn:
        assert await data.available_by_mailbox(conn) == {}
