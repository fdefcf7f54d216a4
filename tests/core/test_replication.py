"""``server.require_sync_replica``: a server says at start when an acknowledged write would live on one machine."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from mainspring.api import create_app
from mainspring.config import Settings
from mainspring.store import Store
from mainspring.store.replication import Replication

SYNCHRONOUS = Replication(False, "on", "ANY 1 (pgautofailover_standby_2)", sync_standbys=1, hidden_standbys=0)


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (SYNCHRONOUS, None),
        (Replication(False, "remote_apply", "s1", 1, 0), None),
        (Replication(False, "on", "s1", 0, 1), None),  # a role that may not see pg_stat_replication's details
        (Replication(False, "on", "", 0, 0), "synchronous_standby_names is empty"),
        (Replication(False, "local", "s1", 1, 0), "synchronous_commit = local"),
        (Replication(False, "off", "s1", 1, 0), "synchronous_commit = off"),
        (Replication(False, "on", "s1", 0, 0), "no synchronous standby is connected"),
        (Replication(True, "on", "s1", 0, 0), "standby"),
    ],
)
def test_what_keeps_an_acknowledged_commit_on_one_machine_is_named(state: Replication, reason: str | None) -> None:
    found = state.why_not_synchronous()
    assert found == reason if reason is None else reason in str(found)


async def test_a_server_without_a_synchronous_standby_warns_at_start_when_one_is_required(
    settings: Settings, store: Store, engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The suite's PostgreSQL has no standby at all, and SQLite never has one."""
    settings.server.require_sync_replica = True
    with caplog.at_level(logging.WARNING, logger="mainspring.server"):
        app: Any = create_app(settings, store=store)
        async with app.router.lifespan_context(app):
            pass
    warnings = [r.getMessage() for r in caplog.records if "require_sync_replica" in r.getMessage()]
    expected = "synchronous_standby_names is empty" if engine == "postgres" else "sqlite, which has no replica"
    assert len(warnings) == 1 and expected in warnings[0], warnings


async def test_no_warning_unless_a_synchronous_standby_is_required(
    settings: Settings, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="mainspring.server"):
        app: Any = create_app(settings, store=store)
        async with app.router.lifespan_context(app):
            pass
    assert not [r for r in caplog.records if "require_sync_replica" in r.getMessage()]
