"""Raising many alerts of one code in one transaction (start-up recovery may raise thousands).

Same rules as ``alerts.raise_alert``: stored, emitted as ``alert.raised``, logged at ERROR after commit,
and an open alert with the same code and subject is not raised twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from sqlalchemy import select

from mainspring.core import outbox
from mainspring.core.tables import alerts
from mainspring.store import Transaction

log = logging.getLogger("mainspring.alerts")


async def raise_alerts(
    tx: Transaction, code: str, subject_kind: str, items: Sequence[tuple[str, str]], severity: str = "error"
) -> list[str]:
    """Record one alert per ``(subject_id, detail)`` in ``tx``; answers the ids of the new ones."""
    if not items:
        return []
    subjects = [subject for subject, _ in items]
    already = set()
    for start in range(0, len(subjects), 1000):
        chunk = subjects[start:start + 1000]
        already |= set((await tx.execute(select(alerts.c.subject_id).where(
            alerts.c.code == code, alerts.c.subject_kind == subject_kind, alerts.c.subject_id.in_(chunk),
            alerts.c.acked_at.is_(None)))).scalars())
    now = tx.store.now_ms()
    rows = []
    for subject, detail in items:
        if subject in already:
            continue
        already.add(subject)
        rows.append({"id": uuid.uuid4().hex, "at": now, "severity": severity, "code": code,
                     "subject_kind": subject_kind, "subject_id": subject, "detail": detail})
    if not rows:
        return []
    await tx.execute(alerts.insert(), rows)
    await outbox.emit_many(tx, [
        outbox.Event("alert.raised", subject_kind, r["subject_id"],
                     {"alert_id": r["id"], "code": code, "severity": severity, "detail": r["detail"]})
        for r in rows
    ])

    def report() -> None:
        for r in rows[:100]:
            log.error("alert %s on %s %s: %s", code, subject_kind, r["subject_id"], r["detail"],
                      extra={"alert_id": r["id"], "code": code})
        if len(rows) > 100:
            log.error("alert %s raised on %d more %s subjects", code, len(rows) - 100, subject_kind)

    tx.after_commit(report)
    return [r["id"] for r in rows]
