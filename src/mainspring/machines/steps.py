"""One step of a machine: apply a processor's answer, or record its failure, guarded by the machine's version.

The answer computed from version N is written only while the machine is still at N, so two servers (or a
Call racing a timer) can never both apply a step. The history rows, aux state, timer, outbox events,
idempotent operation and failure-journal rows of a step commit together or not at all. Statements are in
``data``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from mainspring.core import outbox
from mainspring.core.alerts import raise_alert
from mainspring.machines import data
from mainspring.machines.data import Applied, HistoryRow, MachineRow, StepWrite
from mainspring.machines.processor import UNSET, Answer, ProcessorError
from mainspring.store import Store, Transaction, format_time

CHANNEL = "machines"
SUBJECT = "machine"
RECENT = "machines:recent-versions"

T = TypeVar("T")


def note_version(store_extras: dict[str, Any], uid: int, version: int) -> None:
    """Remember the version a step on this server left a machine at (a bounded, best-effort map)."""
    recent: dict[int, int] = store_extras.setdefault(RECENT, {})
    if len(recent) > 10_000:
        recent.clear()
    recent[uid] = version


def stepped_since(extras: dict[str, Any], machine: MachineRow) -> bool:
    """Whether a step on this server changed the machine after ``machine`` was read."""
    return extras.get(RECENT, {}).get(machine.uid, machine.version) > machine.version


def history_to_api(events: Sequence[HistoryRow]) -> list[dict[str, Any]]:
    return [{"id": e.event_id, "created_at": format_time(e.created_at), "data": e.data} for e in events]


def processor_view(machine: MachineRow, events: Sequence[HistoryRow]) -> dict[str, Any]:
    """The machine as a processor sees it."""
    return {"namespace": machine.namespace, "id": machine.id, "status": machine.status, "history": history_to_api(events), "aux_state": machine.aux_state}


async def applied_once(store: Store, work: Callable[[Transaction, bool], Awaitable[T | Applied]]) -> T | Applied:
    """Run a step's ``work(tx, grouped)`` in the next group commit; when another transaction held the
    machine's row (``Applied.LOCKED``: nothing written), run it alone in a transaction that waits for the row."""
    result = await store.grouped(lambda tx: work(tx, True))
    if result is not Applied.LOCKED:
        return result
    async with store.transaction() as tx:
        return await work(tx, False)


async def apply_answer(
    tx: Transaction,
    machine: MachineRow,
    answer: Answer,
    *,
    grouped: bool,
    consume_timer: bool = False,
    delivered_notification: int | None = None,
    repaired: bool = False,
) -> Applied:
    """Apply one answer to the machine read as ``machine``; anything but APPLIED wrote nothing."""
    now = tx.store.now_ms()
    timer_at = None if consume_timer else machine.timer_at
    timer_range, timer_timeout_ms = (None, None) if consume_timer else (machine.timer_range, machine.timer_timeout_ms)
    if answer.timer_at is not UNSET:
        timer_at = answer.timer_at
        # A timer set by this answer carries this answer's range and timeout (Machinegun's SetTimerAction).
        timer_range = answer.timer_range.model_dump() if timer_at is not None and answer.timer_range is not None else None
        timer_timeout_ms = answer.timer_timeout_ms if timer_at is not None else None
    reset_retry = consume_timer or repaired
    step = StepWrite(
        uid=machine.uid,
        version=machine.version,
        last_event_id=machine.last_event_id + len(answer.events),
        aux_state=machine.aux_state if answer.aux_state is UNSET else answer.aux_state,
        timer_at=timer_at,
        retry_attempt=0 if reset_retry else machine.retry_attempt,
        retry_since=None if reset_retry else machine.retry_since,
        status="working" if repaired else machine.status,
        error=None if repaired else machine.error,
        updated_at=now,
        timer_range=timer_range,
        timer_timeout_ms=timer_timeout_ms,
    )
    if tx.store.is_postgres:
        outcome = await data.write_step_with_events(tx, machine, step, answer.events, grouped=grouped)
        if outcome is not Applied.APPLIED:
            return outcome
    else:
        outcome = await data.write_step(tx, step)
        if outcome is not Applied.APPLIED:
            return outcome
        await append_history(tx, machine, answer.events, now, machine.last_event_id + 1)
    if delivered_notification is not None:
        await data.delete_notification(tx, delivered_notification)
        await data.refresh_notify_at(tx, machine.uid)
    if repaired:
        await journal(tx, machine.uid, "repair", "repaired", "repaired by the processor", permanent=False, attempt=0, outcome="repaired")
        await outbox.emit(tx, "machine.repaired", SUBJECT, machine.subject, {"namespace": machine.namespace, "id": machine.id, "simple": False})
    if answer.remove:
        await remove_machine(tx, machine)
    elif timer_at is not None or delivered_notification is not None:
        tx.notify(CHANNEL)
    return Applied.APPLIED


async def append_history(tx: Transaction, machine: MachineRow, events: Sequence[Any], now: int, first: int) -> None:
    """Append ``events`` as ids ``first``, ``first+1``… with one ``machine.event`` each."""
    if not events:
        return
    await data.insert_history(tx, machine.uid, first, events, now)
    await outbox.emit_many(tx, event_of_each(machine, events, first))


def event_of_each(machine: MachineRow, events: Sequence[Any], first: int) -> list[outbox.Event]:
    """One ``machine.event`` per history event, ids from ``first``."""
    return [
        outbox.Event("machine.event", SUBJECT, machine.subject, {"namespace": machine.namespace, "id": machine.id, "event_id": first + i, "data": event})
        for i, event in enumerate(events)
    ]


async def remove_machine(tx: Transaction, machine: MachineRow) -> None:
    """Remove a machine with everything it has, and say so on the outbox."""
    await data.delete_machine(tx, machine)
    await outbox.emit(tx, "machine.removed", SUBJECT, machine.subject, {"namespace": machine.namespace, "id": machine.id})


async def journal(tx: Transaction, uid: int, kind: str, code: str, detail: str, *, permanent: bool, attempt: int, outcome: str) -> None:
    await data.insert_failure(tx, uid, tx.store.now_ms(), kind, code, detail, permanent=permanent, attempt=attempt, outcome=outcome)


async def fail_machine(tx: Transaction, machine: MachineRow, kind: str, error: ProcessorError, attempt: int) -> bool:
    """Turn the machine ``failed`` (guarded by its version), journal why, emit and alert."""
    now = tx.store.now_ms()
    detail = {"kind": kind, "code": error.code, "detail": error.detail, "permanent": error.permanent, "at": format_time(now)}
    if not await data.fail_machine(tx, machine, detail, now):
        return False
    await journal(tx, machine.uid, kind, error.code, error.detail, permanent=error.permanent, attempt=attempt, outcome="failed")
    await outbox.emit(tx, "machine.failed", SUBJECT, machine.subject, {"namespace": machine.namespace, "id": machine.id, "error": detail})
    await raise_alert(tx, "machine_failed", SUBJECT, machine.subject, f"{kind} failed: {error.detail}")
    return True
