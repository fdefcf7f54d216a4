"""Alerts: what an administrator must see. Stored, logged at ERROR, and emitted as ``alert.raised``."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from sqlalchemy import select

from mainspring.core import outbox
from mainspring.core.errors import AlertNotFound
from mainspring.core.paging import decode_cursor, encode_cursor
from mainspring.core.tables import alerts
from mainspring.store import Store, Transaction, format_time

log = logging.getLogger("mainspring.alerts")


def alert_to_api(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": format_time(row.at),
        "severity": row.severity,
        "code": row.code,
        "subject": {"kind": row.subject_kind, "id": row.subject_id},
        "detail": row.detail,
        "acked_at": format_time(row.acked_at),
    }


async def raise_alert(
    tx: Transaction, code: str, subject_kind: str, subject_id: str, detail: str, severity: str = "error"
) -> str:
    """Record an alert in ``tx``. An open alert with the same code and subject is not raised twice."""
    existing = (
        await tx.execute(
            select(alerts.c.id).where(
                alerts.c.code == code,
                alerts.c.subject_kind == subject_kind,
                alerts.c.subject_id == subject_id,
                alerts.c.acked_at.is_(None),
            )
        )
    ).scalar()
    if existing is not None:
        return str(existing)
    alert_id = uuid.uuid4().hex
    row = {
        "id": alert_id,
        "at": tx.store.now_ms(),
        "severity": severity,
        "code": code,
        "subject_kind": subject_kind,
        "subject_id": subject_id,
        "detail": detail,
    }
    await tx.execute(alerts.insert().values(**row))
    await outbox.emit(tx, "alert.raised", subject_kind, subject_id, {"alert_id": alert_id, "code": code, "severity": severity, "detail": detail})
    tx.after_commit(lambda: log.error("alert %s on %s %s: %s", code, subject_kind, subject_id, detail, extra={"alert_id": alert_id, "code": code}))
    return alert_id


async def list_alerts(store: Store, *, open_only: bool, limit: int, cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
    query = select(alerts).order_by(alerts.c.at.desc(), alerts.c.id.desc()).limit(limit + 1)
    if open_only:
        query = query.where(alerts.c.acked_at.is_(None))
    if cursor:
        at, alert_id = decode_cursor(cursor, 2)
        query = query.where((alerts.c.at < at) | ((alerts.c.at == at) & (alerts.c.id < alert_id)))
    async with store.read() as conn:
        rows = (await conn.execute(query)).all()
    next_cursor = encode_cursor(rows[limit - 1].at, rows[limit - 1].id) if len(rows) > limit else None
    return [alert_to_api(r) for r in rows[:limit]], next_cursor


async def ack_alert(store: Store, alert_id: str) -> dict[str, Any]:
    """Acknowledge an alert; acknowledging twice keeps the first time."""
    async with store.transaction() as tx:
        row = (await tx.execute(select(alerts).where(alerts.c.id == alert_id))).first()
        if row is None:
            raise AlertNotFound(f"no alert {alert_id}")
        if row.acked_at is None:
            await tx.execute(alerts.update().where(alerts.c.id == alert_id).values(acked_at=tx.store.now_ms()))
            await outbox.emit(tx, "alert.acked", row.subject_kind, row.subject_id, {"alert_id": alert_id, "code": row.code})
        row = (await tx.execute(select(alerts).where(alerts.c.id == alert_id))).one()
    return alert_to_api(row)
