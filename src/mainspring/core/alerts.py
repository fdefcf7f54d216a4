"""Alerts: what an administrator must see. Stored, logged at ERROR, and emitted as ``alert.raised``.

An alert closes itself once its subject is fixed (a failed machine repaired, an IN_DOUBT process resolved, a
cleanup finished): each face tells which of the open alerts it raised are fixed now (``Face.fixed_alerts``),
and ``close_fixed_alerts`` records the closing — when, by whom, why — and emits ``alert.resolved``. The
faces are asked about the present state, not told by events, so a subject that broke again keeps its alert.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TypedDict

from mainspring.core import data, outbox
from mainspring.core.data import Alert
from mainspring.core.errors import AlertNotFound
from mainspring.core.paging import encode_cursor, time_key_cursor
from mainspring.store import Store, Transaction, format_time
from mainspring.store.dialect import Executor

log = logging.getLogger("mainspring.alerts")


class AlertView(TypedDict):
    """An alert as the API shows it."""

    id: str
    at: str | None
    severity: str
    code: str
    subject: outbox.SubjectView
    detail: str
    acked_at: str | None
    resolved_at: str | None
    resolved_by: str | None
    resolution: str | None


def alert_to_api(alert: Alert) -> AlertView:
    return {
        "id": alert.id,
        "at": format_time(alert.at),
        "severity": alert.severity,
        "code": alert.code,
        "subject": {"kind": alert.subject_kind, "id": alert.subject_id},
        "detail": alert.detail,
        "acked_at": format_time(alert.acked_at),
        "resolved_at": format_time(alert.resolved_at),
        "resolved_by": alert.resolved_by,
        "resolution": alert.resolution,
    }


async def raise_alert(
    tx: Transaction, code: str, subject_kind: str, subject_id: str, detail: str, severity: str = "error"
) -> str | None:
    """Record an alert in ``tx``; answers its id, or None when an open alert with the same code and subject
    already says it."""
    raised = await raise_alerts(tx, code, subject_kind, [(subject_id, detail)], severity)
    return raised[0] if raised else None


async def raise_alerts(
    tx: Transaction, code: str, subject_kind: str, items: Sequence[tuple[str, str]], severity: str = "error"
) -> list[str]:
    """Record one alert per ``(subject_id, detail)`` in ``tx`` (start-up recovery may raise thousands at
    once); an open alert with the same code and subject is not raised twice. Answers the new alerts' ids."""
    if not items:
        return []
    already = await data.open_alert_subjects(tx, code, subject_kind, (subject for subject, _ in items))
    now = tx.store.now_ms()
    raised: list[Alert] = []
    for subject, detail in items:
        if subject in already:
            continue
        already.add(subject)
        raised.append(Alert(uuid.uuid4().hex, now, severity, code, subject_kind, subject, detail, None))
    if not raised:
        return []
    await data.insert_alerts(tx, raised)
    await outbox.emit_many(tx, [
        outbox.Event("alert.raised", subject_kind, a.subject_id,
                     {"alert_id": a.id, "code": code, "severity": severity, "detail": a.detail})
        for a in raised
    ])

    def report() -> None:
        for a in raised[:100]:
            log.error("alert %s on %s %s: %s", code, subject_kind, a.subject_id, a.detail,
                      extra={"alert_id": a.id, "code": code})
        if len(raised) > 100:
            log.error("alert %s raised on %d more %s subjects", code, len(raised) - 100, subject_kind)

    tx.after_commit(report)
    return [a.id for a in raised]


async def list_alerts(store: Store, *, open_only: bool, limit: int, cursor: str | None) -> tuple[list[AlertView], str | None]:
    before = None
    if cursor:
        before = time_key_cursor(cursor)
    async with store.read() as conn:
        found = await data.list_alerts(conn, open_only=open_only, limit=limit + 1, before=before)
    next_cursor = encode_cursor(found[limit - 1].at, found[limit - 1].id) if len(found) > limit else None
    return [alert_to_api(a) for a in found[:limit]], next_cursor


async def ack_alert(store: Store, alert_id: str) -> AlertView:
    """Acknowledge an alert; acknowledging twice keeps the first time."""
    async with store.transaction() as tx:
        alert = await data.get_alert(tx, alert_id)
        if alert is None:
            raise AlertNotFound(f"no alert {alert_id}")
        if alert.acked_at is None:
            await data.ack_alert(tx, alert_id, tx.store.now_ms())
            await outbox.emit(tx, "alert.acked", alert.subject_kind, alert.subject_id, {"alert_id": alert_id, "code": alert.code})
            alert = await data.get_alert(tx, alert_id)
    assert alert is not None
    return alert_to_api(alert)


# Who closes an alert whose subject was found fixed: the server itself, not a person.
CLOSED_BY = "mainspring"
CLOSE_BATCH = 500

FixedAlerts = Callable[[Executor, Sequence[Alert]], Awaitable[Mapping[str, str]]]
"""A face's check: of these open alerts (of the codes it raises), which are fixed now → why."""


async def close_fixed_alerts(store: Store, checks: Mapping[str, FixedAlerts]) -> int:
    """Close every open alert whose face says its subject is fixed; answers how many were closed. ``checks``
    maps alert codes to the check of the face that raises them. Every server may run it at the same time as
    another: an alert is closed (and ``alert.resolved`` emitted) once."""
    closed = 0
    after: tuple[int, str] | None = None
    while checks:
        async with store.read() as conn:
            found = await data.open_alerts_of(conn, checks, CLOSE_BATCH, after)
            fixed: dict[str, str] = {}
            for check in _distinct(checks.values()):
                fixed.update(await check(conn, [a for a in found if checks[a.code] is check]))
        if fixed:
            async with store.transaction() as tx:
                now = tx.store.now_ms()
                for alert in found:
                    why = fixed.get(alert.id)
                    if why is not None and await data.resolve_alert(tx, alert.id, now, CLOSED_BY, why):
                        closed += 1
                        await outbox.emit(tx, "alert.resolved", alert.subject_kind, alert.subject_id,
                                          {"alert_id": alert.id, "code": alert.code, "resolved_by": CLOSED_BY, "resolution": why})
        if len(found) < CLOSE_BATCH:
            break
        after = (found[-1].at, found[-1].id)
    if closed:
        log.info("closed %d alert(s) whose subject was fixed", closed)
    return closed


def _distinct(checks: Iterable[FixedAlerts]) -> list[FixedAlerts]:
    seen: list[FixedAlerts] = []
    for check in checks:
        if check not in seen:
            seen.append(check)
    return seen
