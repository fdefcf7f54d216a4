"""Driven machines: machines whose steps come from code that advances them itself (a ``processor.Driver``, the
workflows layer's runs) instead of a processor answering one signal at a time.

Everything here is a machine step like any other — version-fenced, its history events and their
``machine.event`` rows in the same transaction, group-committed — with what a driver needs beyond a processor's
answer: a step may keep the machine's lease (its server goes on advancing it), a step may deliver several
notifications at once, and a step may append events the driver did not write (a cancel request) while leaving
the lease with whoever holds it.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from mainspring.core import outbox
from mainspring.core.alerts import raise_alert
from mainspring.machines import data
from mainspring.machines.data import (
    Applied,
    HistoryRow,
    MachineRow,
    NewMachine,
    NotificationRow,
    StepRows,
    StepWrite,
)
from mainspring.machines.namespaces import save_namespace
from mainspring.machines.settings import NamespaceConfig, ProcessorConfig
from mainspring.machines.steps import (
    CHANNEL,
    SUBJECT,
    PendingStep,
    applied_once,
    event_of_each,
    journal,
    write_steps,
)
from mainspring.store import Store, Transaction
from mainspring.store.dialect import Executor
from mainspring.types import JsonData, JsonObject

__all__ = [
    "CHANNEL", "SUBJECT", "Applied", "Change", "HistoryRow", "MachineRow", "NewMachine", "NotificationRow", "apply", "create", "create_at_once",
    "extend_leases",
    "history", "lock", "machine", "notifications", "notify_in", "take",
]


@dataclass(frozen=True, slots=True)
class Change:
    """One step of a driven machine, from the version ``machine`` was read at."""

    events: Sequence[JsonData]
    aux_state: JsonData
    timer_at: int | None
    lease: tuple[str, int] | None
    """(token, expiry) the machine keeps after the step; None ends the lease."""
    status: str = "working"
    error: JsonObject | None = None
    delivered: Sequence[int] = ()
    """Notifications (seqs) this step delivered: deleted with it."""
    then: Callable[[Transaction], Awaitable[None]] | None = None
    """More work in the step's transaction, once it applied."""
    announce: Sequence[tuple[str, str, str, object]] = ()
    """Events of the step besides its ``machine.event`` ones: (type, subject kind, subject id, data), written in
    the step's own statement on PostgreSQL (no transaction of several round trips for them)."""
    channels: Sequence[str] = ()
    """Wake-ups the step sends once applied."""


def _step(machine: MachineRow, change: Change, now: int) -> PendingStep:
    write = StepWrite(
        uid=machine.uid, version=machine.version, last_event_id=machine.last_event_id + len(change.events), aux_state=change.aux_state,
        timer_at=change.timer_at, retry_attempt=0, retry_since=None, status=change.status, error=change.error, updated_at=now,
        lease_token=None if change.lease is None else change.lease[0], lease_expires_at=None if change.lease is None else change.lease[1],
    )
    failed = change.status == "failed" and machine.status != "failed"
    if not change.delivered and change.then is None and not failed:
        return PendingStep(StepRows(machine, write, change.events, announce=change.announce, channels=change.channels))

    async def then(tx: Transaction) -> None:
        if change.delivered:
            await data.delete_notifications(tx, machine.uid, change.delivered)
            tx.notify(CHANNEL)
        if failed:
            detail = change.error or {}
            await journal(tx, machine.uid, "driver", "failed", str(detail.get("message", ""))[:4000], permanent=True, attempt=1, outcome="failed")
            await outbox.emit(tx, "machine.failed", SUBJECT, machine.subject, {"namespace": machine.namespace, "id": machine.id, "error": detail})
            await raise_alert(tx, "machine_failed", SUBJECT, machine.subject, f"{machine.namespace}/{machine.id} failed: {detail.get('message', '')}"[:1000])
        if change.then is not None:
            await change.then(tx)

    return PendingStep(StepRows(machine, write, change.events, announce=change.announce, channels=change.channels), then)


def advanced(machine: MachineRow, change: Change, now: int) -> MachineRow:
    """The machine as it is once ``change`` applied (what its driver keeps in memory)."""
    return MachineRow(
        machine.uid, machine.namespace, machine.id, change.status, machine.version + 1, machine.last_event_id + len(change.events),
        change.aux_state, change.timer_at, machine.notify_at, machine.wake_at, 0, None,
        None if change.lease is None else change.lease[0], None if change.lease is None else change.lease[1],
        change.error, machine.created_at, now, None, None,
    )


async def apply(store: Store, machine: MachineRow, change: Change) -> tuple[Applied, MachineRow]:
    """Apply ``change`` in the next group commit, guarded by ``machine``'s version; answers how it ended and the
    machine as it now is (unchanged unless applied)."""
    now = store.now_ms()
    outcome = await applied_once(store, _step(machine, change, now))
    return outcome, (advanced(machine, change, now) if outcome is Applied.APPLIED else machine)


async def create(tx: Transaction, namespace: str, machine_id: str, events: Sequence[JsonData], aux_state: JsonData, timer_at: int | None,
                 lease: tuple[str, int] | None, announce: Sequence[outbox.Event] = ()) -> MachineRow:
    """A new driven machine with its first events, then the events of ``announce`` (a taken id is a unique
    violation)."""
    now = tx.store.now_ms()
    machine = await data.insert_machine(tx, namespace, machine_id, aux_state, timer_at, len(events), now, lease=lease)
    await data.insert_history(tx, machine.uid, 1, events, now)
    await outbox.emit_many(tx, [outbox.Event("machine.created", SUBJECT, machine.subject, {"namespace": namespace, "id": machine_id}),
                                *event_of_each(machine, events, 1), *announce])
    if timer_at is not None and lease is None:
        # A machine created with its lease (a workflow run its server advances at once) is no work for the
        # background loop until the lease runs out: waking it would only cost it a look at nothing due.
        tx.notify(CHANNEL)
    return machine


CREATE_KEY = "machines.driven.create"


async def create_at_once(store: Store, new: NewMachine) -> MachineRow | None:
    """PostgreSQL: ``new`` created in one statement with the creates arriving at the same moment — the whole
    transaction when nothing else shares it, one round trip; the machine, or None when its id is taken."""
    return await store.grouped_batch(CREATE_KEY, _create_all, new)


async def _create_all(tx: Transaction, new: list[NewMachine]) -> list[MachineRow | None]:
    # As ``create``: a machine created with its lease is no work for the background loop until the lease ends.
    wake = [CHANNEL] if any(m.timer_at is not None and m.lease is None for m in new) else []
    return await data.create_machines_with_events(tx, new, wake)


async def store_namespace(store: Store, name: str, timeout_ms: int) -> None:
    """Store an in-process namespace with this step timeout (what the background loop's lease of a due machine
    lasts), unless it is stored so already."""
    async with store.read() as conn:
        stored = await data.get_namespace(conn, name)
    if stored is not None and stored.timeout_ms == timeout_ms and stored.processor_url is None:
        return
    config = NamespaceConfig(processor=ProcessorConfig(timeout_ms=min(timeout_ms, 3_600_000)))
    async with store.transaction() as tx:
        await save_namespace(tx, name, config)


async def machine(store: Store, namespace: str, machine_id: str) -> MachineRow | None:
    async with store.read() as conn:
        return await data.get_machine(conn, namespace, machine_id)


async def lock(tx: Transaction, namespace: str, machine_id: str) -> MachineRow | None:
    """The machine, its row held by ``tx``."""
    return await data.lock_machine(tx, namespace, machine_id)


async def append(tx: Transaction, machine: MachineRow, events: Sequence[JsonData], aux_state: JsonData, *, timer_at: int | None, status: str = "working",
                 error: JsonObject | None = None) -> MachineRow:
    """A step written by someone other than the machine's driver (a cancel or retry request), on a machine whose
    row ``tx`` holds: its events appended, its lease left to whoever holds it (the driver finds the new version
    at its next step and reads what was appended)."""
    now = tx.store.now_ms()
    change = Change(events, aux_state, timer_at, None if machine.lease_token is None else (machine.lease_token, machine.lease_expires_at or 0),
                    status=status, error=error)
    (outcome,) = await write_steps(tx, [_step(machine, change, now)], grouped=False)
    if outcome is not Applied.APPLIED:
        raise RuntimeError("a held machine row moved on")
    if status == "working" and machine.status == "failed":
        await outbox.emit(tx, "machine.repaired", SUBJECT, machine.subject, {"namespace": machine.namespace, "id": machine.id, "simple": False})
    tx.notify(CHANNEL)
    return advanced(machine, change, now)


async def notify_in(tx: Transaction, machine: MachineRow, args: JsonData) -> None:
    """Queue a notification for a machine whose row ``tx`` holds; delivered to its driver in order."""
    await data.insert_notification(tx, uuid.uuid4().hex, machine.uid, args, tx.store.now_ms())
    tx.notify(CHANNEL)


async def history(store: Store, machine: MachineRow, after: int | None = None) -> list[HistoryRow]:
    """The machine's history (after event ``after``), up to the version read."""
    async with store.read() as conn:
        return await data.read_history(conn, machine, after, None, False)


NOTIFICATIONS_LIMIT = 1000


async def notifications(store: Store, uid: int) -> list[NotificationRow]:
    """The machine's oldest pending notifications, in order. Reads that arrive together (many runs woken by
    their timers at once) share one query: a wake costs a share of a read, not a read of its own."""
    return await store.read_batched("driven.notifications", _notifications_of_all, uid)


async def _notifications_of_all(conn: Executor, uids: list[int]) -> list[list[NotificationRow]]:
    found = await data.notifications_of_many(conn, uids, NOTIFICATIONS_LIMIT)
    return [found[uid] for uid in uids]


async def extend_leases(store: Store, leased: Sequence[tuple[int, str, int]]) -> set[int]:
    """Extend these (uid, token, expiry) leases; answers the uids still held."""
    if not leased:
        return set()
    async with store.transaction() as tx:
        return await data.extend_leases(tx, leased)


async def take(store: Store, machine: MachineRow, token: str, expires: int) -> bool:
    """Lease the machine again while nobody holds it and it is still at the version read."""
    async with store.transaction() as tx:
        return await data.take_at_version(tx, machine.uid, machine.version, token, store.now_ms(), expires)


async def current(store: Store, uids: Sequence[int]) -> list[MachineRow]:
    async with store.read() as conn:
        return await data.machines_by_uid(conn, uids)
