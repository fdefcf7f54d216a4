"""Which of the exchange's open alerts are fixed now (``core.alerts.close_fixed_alerts`` closes them).

An IN_DOUBT process is fixed once it left IN_DOUBT (resolved by the client's API_4/API_5 or by an operator);
a failing cleanup once the process left CLEANUP; a failing file move once the message's file is where the
store says it is. The other alerts (a commit refused, a file missing) are facts to read: they stay until acked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from mainspring.core.alerts import FixedAlerts
from mainspring.core.data import Alert
from mainspring.exchange import data
from mainspring.store.dialect import Executor

T = TypeVar("T")


def _fixed(raised: Sequence[Alert], now_of: Mapping[str, T], gone: str, why_fixed: Callable[[T], str | None]) -> dict[str, str]:
    """Alert id → why, for the alerts whose subject is gone or whose present state ``why_fixed`` accepts."""
    fixed: dict[str, str] = {}
    for alert in raised:
        if alert.subject_id not in now_of:
            fixed[alert.id] = gone
        elif (why := why_fixed(now_of[alert.subject_id])) is not None:
            fixed[alert.id] = why
    return fixed


async def in_doubt_resolved(conn: Executor, raised: Sequence[Alert]) -> dict[str, str]:
    states = await data.process_states(conn, [a.subject_id for a in raised])
    return _fixed(raised, states, "process removed", lambda s: None if s == "IN_DOUBT" else f"IN_DOUBT resolved: the process is {s}")


async def cleanup_done(conn: Executor, raised: Sequence[Alert]) -> dict[str, str]:
    states = await data.process_states(conn, [a.subject_id for a in raised])
    return _fixed(raised, states, "process removed", lambda s: None if s == "CLEANUP" else f"cleanup done: the process is {s}")


async def file_move_done(conn: Executor, raised: Sequence[Alert]) -> dict[str, str]:
    synced = await data.messages_synced(conn, [a.subject_id for a in raised])
    return _fixed(raised, synced, "message removed", lambda done: "file move done" if done else None)


FIXED_ALERTS: Mapping[str, FixedAlerts] = {
    "exchange_in_doubt": in_doubt_resolved,
    "exchange_cleanup_failing": cleanup_done,
    "exchange_file_move_failing": file_move_done,
}
