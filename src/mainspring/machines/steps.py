"""One step of a machine: apply a processor's answer, or record its failure, guarded by the machine's version.

The answer computed from version N is written only while the machine is still at N, so two servers (or a
Call racing a timer) can never both apply a step. The history rows, aux state, timer, outbox events,
idempotent operation and failure-journal rows of a step commit together or not at all. Statements are in
``data``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mainspring.core import outbox
from mainspring.core.alerts import raise_alert
from mainspring.machines import data
from mainspring.machines.data import Applied, HistoryRow, MachineRow, OperationRow, StepRows, StepWrite
from mainspring.machines.processor import UNSET, Answer, HistoryEvent, ProcessorError, ProcessorView
from mainspring.store import Store, Transaction, format_time
from mainspring.types import JsonData, JsonObject

CHANNEL = "machines"
SUBJECT = "machine"
RECENT = "machines:recent-versions"


def note_version(store_extras: dict[str, Any], uid: int, version: int) -> None:
    """Remember the version a step on this server left a machine at (a bounded, best-effort map)."""
    recent: dict[int, int] = store_extras.setdefault(RECENT, {})
    if len(recent) > 10_000:
        recent.clear()
    recent[uid] = version


def stepped_since(extras: dict[str, Any], machine: MachineRow) -> bool:
    """Whether a step on this server changed the machine after ``machine`` was read."""
    return extras.get(RECENT, {}).get(machine.uid, machine.version) > machine.version


def history_to_api(events: Sequence[HistoryRow]) -> list[HistoryEvent]:
    return [{"id": e.event_id, "created_at": format_time(e.created_at), "data": e.data} for e in events]


def processor_view(machine: MachineRow, events: Sequence[HistoryRow]) -> ProcessorView:
    """The machine as a processor sees it."""
    return {"namespace": machine.namespace, "id": machine.id, "status": machine.status, "history": history_to_api(events), "aux_state": machine.aux_state}


@dataclass(frozen=True, slots=True)
class PendingStep:
    """A processor's answer ready to be applied: the rows it writes and, for the few steps that write more than
    those (a delivered notification, a repair, a removal), what else they write in the same transaction."""

    rows: StepRows
    then: Callable[[Transaction], Awaitable[None]] | None = None


STEPS_KEY = "machines.steps"


async def applied_once(store: Store, step: PendingStep) -> Applied:
    """Apply ``step`` in the next group commit, in one statement with the steps of other machines arriving at the
    same moment; when another transaction held the machine's row (``Applied.LOCKED``: nothing written), apply it
    alone in a transaction that waits for the row. Answers once committed (or known not to apply)."""
    outcome = await store.grouped_batch(STEPS_KEY, _write_grouped, step)
    if outcome is not Applied.LOCKED:
        return outcome
    async with store.transaction() as tx:
        (outcome,) = await write_steps(tx, [step], grouped=False)
    return outcome


async def _write_grouped(tx: Transaction, steps: list[PendingStep]) -> list[Applied]:
    return await write_steps(tx, steps, grouped=True)


async def write_steps(tx: Transaction, steps: Sequence[PendingStep], *, grouped: bool) -> list[Applied]:
    """Write ``steps`` in ``tx``, each guarded by the version it read; per step, how it ended (anything but
    APPLIED wrote nothing of it)."""
    # A step that keeps its machine's lease (a driven run going on) needs no look from the background loop.
    wake = [CHANNEL] if any(s.rows.step.timer_at is not None and s.rows.step.lease_token is None for s in steps) else []
    if tx.store.dialect.one_statement_writes:
        outcomes = await data.write_steps_with_events(
            tx, [s.rows for s in steps], grouped=grouped, wake=wake, more=any(s.then is not None for s in steps)
        )
    else:
        outcomes = []
        for s in steps:
            rows = s.rows
            outcome = await data.write_step(tx, rows.step)
            if outcome is Applied.APPLIED:
                await append_history(tx, rows.machine, rows.events, rows.step.updated_at, rows.machine.last_event_id + 1)
                if rows.operation is not None:
                    await data.insert_operation(tx, rows.operation)
                if rows.announce:
                    await outbox.emit_many(tx, [outbox.Event(kind, subject_kind, subject_id, data)  # type: ignore[arg-type]
                                                for kind, subject_kind, subject_id, data in rows.announce])
                for channel in (*wake, *rows.channels):
                    tx.notify(channel)
            outcomes.append(outcome)
    for s, outcome in zip(steps, outcomes, strict=True):
        if outcome is Applied.APPLIED and s.then is not None:
            await s.then(tx)
    return outcomes


def pending_step(
    machine: MachineRow,
    answer: Answer,
    now: int,
    *,
    consume_timer: bool = False,
    delivered_notification: int | None = None,
    repaired: bool = False,
    operation: OperationRow | None = None,
) -> PendingStep:
    """What applying one answer to the machine read as ``machine`` writes."""
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
    if delivered_notification is None and not repaired and not answer.remove:
        return PendingStep(StepRows(machine, step, answer.events, operation))

    async def then(tx: Transaction) -> None:
        if delivered_notification is not None:
            await data.delete_notification(tx, delivered_notification)
            await data.refresh_notify_at(tx, machine.uid)
            tx.notify(CHANNEL)
        if repaired:
            await journal(tx, machine.uid, "repair", "repaired", "repaired by the processor", permanent=False, attempt=0, outcome="repaired")
            await outbox.emit(tx, "machine.repaired", SUBJECT, machine.subject, {"namespace": machine.namespace, "id": machine.id, "simple": False})
        if answer.remove:
            await remove_machine(tx, machine)
        if operation is not None:
            # After a removal, which deletes the machine's operations: a repeat still gets this answer.
            await data.insert_operation(tx, operation)

    return PendingStep(StepRows(machine, step, answer.events), then)


async def append_history(tx: Transaction, machine: MachineRow, events: Sequence[JsonData], now: int, first: int) -> None:
    """Append ``events`` as ids ``first``, ``first+1``… with one ``machine.event`` each."""
    if not events:
        return
    await data.insert_history(tx, machine.uid, first, events, now)
    await outbox.emit_many(tx, event_of_each(machine, events, first))


def event_of_each(machine: MachineRow, events: Sequence[JsonData], first: int) -> list[outbox.Event]:
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
    detail: JsonObject = {"kind": kind, "code": error.code, "detail": error.detail, "permanent": error.permanent, "at": format_time(now)}
    if not await data.fail_machine(tx, machine, detail, now):
        return False
    await journal(tx, machine.uid, kind, error.code, error.detail, permanent=error.permanent, attempt=attempt, outcome="failed")
    await outbox.emit(tx, "machine.failed", SUBJECT, machine.subject, {"namespace": machine.namespace, "id": machine.id, "error": detail})
    await raise_alert(tx, "machine_failed", SUBJECT, machine.subject, f"{kind} failed: {error.detail}")
    return True
