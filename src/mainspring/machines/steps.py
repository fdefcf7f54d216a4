"""One step of a machine: apply a processor's answer, or record its failure, guarded by the machine's version.

Every write here is ``UPDATE machines … WHERE uid = :uid AND version = :read_version``: the answer computed
from version N is applied only while the machine is still at N, so two servers (or a Call racing a timer)
can never both apply a step. The history rows, aux state, timer, outbox events, idempotent operation and
failure-journal rows of a step commit together or not at all.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, case, delete, func, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection

from mainspring.core import outbox
from mainspring.core.alerts import raise_alert
from mainspring.machines.processor import UNSET, Answer, ProcessorError
from mainspring.machines.settings import HistoryRange
from mainspring.machines.tables import failures, history, machines, notifications, operations
from mainspring.store import Transaction, format_time

CHANNEL = "machines"
SUBJECT = "machine"


def subject_id(row: Any) -> str:
    return f"{row.namespace}/{row.id}"


RECENT = "machines:recent-versions"


def note_version(store_extras: dict[str, Any], uid: int, version: int) -> None:
    """Remember the version a step on this server left a machine at (a bounded, best-effort map)."""
    recent: dict[int, int] = store_extras.setdefault(RECENT, {})
    if len(recent) > 10_000:
        recent.clear()
    recent[uid] = version


def stepped_since(ctx: Any, row: Any) -> bool:
    """Whether a step on this server changed the machine after ``row`` was read."""
    return ctx.extras.get(RECENT, {}).get(row.uid, row.version) > row.version


def wake_value(timer_at: int | None) -> ColumnElement[Any]:
    """``wake_at`` for a new timer and the machine's current ``notify_at`` (read under the row lock)."""
    notify_at = machines.c.notify_at
    if timer_at is None:
        return notify_at
    return case((notify_at.is_(None), literal(timer_at)), (notify_at < timer_at, notify_at), else_=literal(timer_at))


async def read_history(conn: AsyncConnection, row: Any, rng: HistoryRange) -> list[dict[str, Any]]:
    """The part ``rng`` of the history of the machine as read in ``row``.

    Bounded by ``row.last_event_id``: under READ COMMITTED a step committing between the two reads would
    otherwise show events newer than the row they belong with."""
    query = select(history.c.event_id, history.c.created_at, history.c.data).where(
        history.c.machine_uid == row.uid, history.c.event_id <= row.last_event_id
    )
    if rng.direction == "backward":
        if rng.after is not None:
            query = query.where(history.c.event_id < rng.after)
        query = query.order_by(history.c.event_id.desc())
    else:
        if rng.after is not None:
            query = query.where(history.c.event_id > rng.after)
        query = query.order_by(history.c.event_id)
    if rng.limit is not None:
        query = query.limit(rng.limit)
    rows = (await conn.execute(query)).all()
    return [{"id": r.event_id, "created_at": format_time(r.created_at), "data": r.data} for r in rows]


def processor_view(row: Any, events: list[dict[str, Any]]) -> dict[str, Any]:
    """The machine as a processor sees it."""
    return {"namespace": row.namespace, "id": row.id, "status": row.status, "history": events, "aux_state": row.aux_state}


async def save_operation(tx: Transaction, namespace: str, machine_id: str, key: str | None, kind: str, status: int, body: Any) -> None:
    """Remember an idempotent operation's answer; a second insert of the key fails the whole step."""
    if key is None:
        return
    await tx.execute(
        operations.insert().values(
            namespace=namespace, machine_id=machine_id, key=key, kind=kind, status_code=status, body=body, created_at=tx.store.now_ms()
        )
    )


async def append_history(tx: Transaction, row: Any, events: list[Any], now: int, first: int) -> None:
    """Insert ``events`` as ids ``first``, ``first+1``… — the (machine, id) key refuses a duplicate."""
    if not events:
        return
    await tx.execute(
        history.insert(),
        [{"machine_uid": row.uid, "event_id": first + i, "created_at": now, "data": data} for i, data in enumerate(events)],
    )
    await outbox.emit_many(
        tx,
        [
            outbox.Event("machine.event", SUBJECT, subject_id(row), {"namespace": row.namespace, "id": row.id, "event_id": first + i, "data": data})
            for i, data in enumerate(events)
        ],
    )


async def apply_answer(
    tx: Transaction,
    row: Any,
    answer: Answer,
    *,
    consume_timer: bool = False,
    delivered_notification: int | None = None,
    repaired: bool = False,
) -> bool:
    """Apply one answer to the machine read as ``row``; False (and nothing written) if it has moved on."""
    now = tx.store.now_ms()
    timer_at = None if consume_timer else row.timer_at
    if answer.timer_at is not UNSET:
        timer_at = answer.timer_at
    values: dict[str, Any] = {
        "version": row.version + 1,
        "last_event_id": row.last_event_id + len(answer.events),
        "timer_at": timer_at,
        "wake_at": wake_value(timer_at),
        "lease_token": None,
        "lease_until": None,
        "updated_at": now,
    }
    if consume_timer or repaired:
        values.update(retry_attempt=0, retry_since=None)
    if repaired:
        values.update(status="working", error=None)
    if answer.aux_state is not UNSET:
        values["aux_state"] = answer.aux_state
    result = await tx.execute(machines.update().where(machines.c.uid == row.uid, machines.c.version == row.version).values(**values))
    if not result.rowcount:
        return False
    await append_history(tx, row, answer.events, now, row.last_event_id + 1)
    if delivered_notification is not None:
        await tx.execute(delete(notifications).where(notifications.c.seq == delivered_notification))
        await refresh_notify_at(tx, row.uid)
    if repaired:
        await journal(tx, row.uid, "repair", "repaired", "repaired by the processor", permanent=False, attempt=0, outcome="repaired")
        await outbox.emit(tx, "machine.repaired", SUBJECT, subject_id(row), {"namespace": row.namespace, "id": row.id, "simple": False})
    if answer.remove:
        await remove_machine_rows(tx, row)
    elif timer_at is not None or delivered_notification is not None:
        tx.notify(CHANNEL)
    return True


async def refresh_notify_at(tx: Transaction, uid: int) -> None:
    """Point ``notify_at`` at the oldest pending notification (they are delivered strictly in order)."""
    head = (
        await tx.execute(
            select(notifications.c.due_at).where(notifications.c.machine_uid == uid).order_by(notifications.c.seq).limit(1)
        )
    ).scalar()
    timer = machines.c.timer_at
    if head is None:
        wake: ColumnElement[Any] = timer
    else:
        wake = case((timer.is_(None), literal(head)), (timer < head, timer), else_=literal(head))
    await tx.execute(machines.update().where(machines.c.uid == uid).values(notify_at=head, wake_at=wake))


async def remove_machine_rows(tx: Transaction, row: Any) -> None:
    """Remove a machine with its history, pending notifications, journal and operations."""
    for table, column in ((history, history.c.machine_uid), (notifications, notifications.c.machine_uid), (failures, failures.c.machine_uid)):
        await tx.execute(delete(table).where(column == row.uid))
    await tx.execute(delete(operations).where(operations.c.namespace == row.namespace, operations.c.machine_id == row.id))
    await tx.execute(delete(machines).where(machines.c.uid == row.uid))
    await outbox.emit(tx, "machine.removed", SUBJECT, subject_id(row), {"namespace": row.namespace, "id": row.id})


async def journal(tx: Transaction, uid: int, kind: str, code: str, detail: str, *, permanent: bool, attempt: int, outcome: str) -> None:
    await tx.execute(
        failures.insert().values(
            machine_uid=uid, at=tx.store.now_ms(), kind=kind, code=code, detail=detail[:4000], permanent=permanent, attempt=attempt, outcome=outcome
        )
    )


async def fail_machine(tx: Transaction, row: Any, kind: str, error: ProcessorError, attempt: int) -> bool:
    """Turn the machine ``failed`` (guarded by its version), journal why, emit and alert."""
    now = tx.store.now_ms()
    detail = {"kind": kind, "code": error.code, "detail": error.detail, "permanent": error.permanent, "at": format_time(now)}
    result = await tx.execute(
        machines.update()
        .where(machines.c.uid == row.uid, machines.c.version == row.version)
        .values(status="failed", error=detail, version=row.version + 1, lease_token=None, lease_until=None, updated_at=now)
    )
    if not result.rowcount:
        return False
    await journal(tx, row.uid, kind, error.code, error.detail, permanent=error.permanent, attempt=attempt, outcome="failed")
    await outbox.emit(tx, "machine.failed", SUBJECT, subject_id(row), {"namespace": row.namespace, "id": row.id, "error": detail})
    await raise_alert(tx, "machine_failed", SUBJECT, subject_id(row), f"{kind} failed: {error.detail}")
    return True


async def count_pending(conn: AsyncConnection, uid: int) -> int:
    return int((await conn.execute(select(func.count()).select_from(notifications).where(notifications.c.machine_uid == uid))).scalar_one())
