"""The machines face's domain functions: Start, Call, Notify, Repair, Get, Remove, list, operations.

A step reads the machine, calls the processor outside any transaction, then applies the answer in one
transaction guarded by the version it read (see ``steps``). A lost race is re-run from a fresh read.
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from mainspring.core import outbox
from mainspring.core.errors import MainspringError
from mainspring.core.paging import decode_cursor, encode_cursor
from mainspring.core.runtime import Context
from mainspring.machines.commit import committer
from mainspring.machines.errors import (
    IdempotencyKeyReused,
    MachineAlreadyExists,
    MachineAlreadyWorking,
    MachineBusy,
    MachineFailed,
    MachineNotFound,
    OperationNotFound,
    ProcessorFailed,
    ProcessorTimeout,
)
from mainspring.machines.namespaces import Namespace, find_namespace, processor_for
from mainspring.machines.processor import UNSET, Answer, ProcessorError
from mainspring.machines.settings import HistoryRange
from mainspring.machines.steps import (
    CHANNEL,
    SUBJECT,
    append_history,
    apply_answer,
    count_pending,
    fail_machine,
    journal,
    note_version,
    processor_view,
    read_history,
    refresh_notify_at,
    remove_machine_rows,
    save_operation,
    subject_id,
)
from mainspring.machines.tables import failures, machines, notifications, operations
from mainspring.store import format_time


@dataclass
class Reply:
    """An HTTP answer a repeat with the same Idempotency-Key gets back unchanged."""

    status: int
    body: Any


LOCKS = "machines:locks"


def machine_lock(ctx: Context, namespace: str, machine_id: str) -> asyncio.Lock:
    """Steps of one machine on this server queue here instead of racing each other to the version check."""
    locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = ctx.extras.setdefault(LOCKS, weakref.WeakValueDictionary())
    key = (namespace, machine_id)
    lock = locks.get(key)
    if lock is None:
        lock = locks[key] = asyncio.Lock()
    return lock


def _problem(error: MainspringError) -> Reply:
    return Reply(error.status, error.problem())


def _processor_error(error: ProcessorError) -> MainspringError:
    return ProcessorTimeout(error.detail) if error.timeout else ProcessorFailed(error.detail)


async def _replay(ctx: Context, namespace: str, machine_id: str, key: str | None, kind: str) -> Reply | None:
    if key is None:
        return None
    async with ctx.store.read() as conn:
        row = (
            await conn.execute(
                select(operations).where(operations.c.namespace == namespace, operations.c.machine_id == machine_id, operations.c.key == key)
            )
        ).first()
    if row is None:
        return None
    if row.kind != kind:
        raise IdempotencyKeyReused(f"key {key!r} was used for a {row.kind}, not a {kind}")
    return Reply(row.status_code, row.body)


async def _load(ctx: Context, namespace: str, machine_id: str, rng: HistoryRange | None = None) -> tuple[Namespace, Any, list[dict[str, Any]]]:
    async with ctx.store.read() as conn:
        ns = await find_namespace(conn, ctx, namespace)
        row = (await conn.execute(select(machines).where(machines.c.namespace == namespace, machines.c.id == machine_id))).first()
        if row is None:
            raise MachineNotFound(f"no machine {machine_id!r} in namespace {namespace!r}")
        events = await read_history(conn, row, rng or ns.config.history)
    return ns, row, events


async def _process(ctx: Context, ns: Namespace, kind: str, args: Any, view: dict[str, Any], timeout_ms: int | None = None) -> Answer:
    processor = processor_for(ctx, ns)
    return await processor.process(kind, args, view, timeout_ms or ns.timeout_ms, ctx.now_ms())


async def start_machine(ctx: Context, namespace: str, machine_id: str, args: Any, key: str | None = None) -> Reply:
    """Create a machine with the processor's ``init`` answer; nothing is created when the processor fails."""
    replay = await _replay(ctx, namespace, machine_id, key, "start")
    if replay is not None:
        return replay
    async with ctx.store.read() as conn:
        ns = await find_namespace(conn, ctx, namespace)
        exists = (await conn.execute(select(machines.c.uid).where(machines.c.namespace == namespace, machines.c.id == machine_id))).first()
    if exists is not None:
        raise MachineAlreadyExists(f"machine {machine_id!r} already exists in namespace {namespace!r}")
    view = {"namespace": namespace, "id": machine_id, "status": "working", "history": [], "aux_state": None}
    try:
        answer = await _process(ctx, ns, "init", args, view)
    except ProcessorError as error:
        raise _processor_error(error) from error
    now = ctx.now_ms()
    timer_at = answer.timer_at if isinstance(answer.timer_at, int) else None
    try:
        async with ctx.store.transaction() as tx:
            uid = (
                await tx.execute(
                    machines.insert()
                    .values(
                        namespace=namespace, id=machine_id, status="working", version=1, last_event_id=len(answer.events),
                        aux_state=None if answer.aux_state is UNSET else answer.aux_state,
                        timer_at=timer_at, notify_at=None, wake_at=timer_at, retry_attempt=0, created_at=now, updated_at=now,
                    )
                    .returning(machines.c.uid)
                )
            ).scalar_one()
            row = (await tx.execute(select(machines).where(machines.c.uid == uid))).one()
            await outbox.emit(tx, "machine.created", SUBJECT, subject_id(row), {"namespace": namespace, "id": machine_id})
            await append_history(tx, row, answer.events, now, 1)
            if answer.remove:
                await remove_machine_rows(tx, row)
            elif timer_at is not None:
                tx.notify(CHANNEL)
                tx.store.notifier.signal(CHANNEL)
            body = _created_body(row, answer, now)
            await save_operation(tx, namespace, machine_id, key, "start", 201, body)
    except IntegrityError as exc:
        if not ctx.store.dialect.is_unique_violation(exc):
            raise
        replay = await _replay(ctx, namespace, machine_id, key, "start")
        if replay is not None:
            return replay
        raise MachineAlreadyExists(f"machine {machine_id!r} already exists in namespace {namespace!r}") from exc
    return Reply(201, body)


def _created_body(row: Any, answer: Answer, now: int) -> dict[str, Any]:
    """The new machine as Get would show it, built from what the step just wrote (no re-read)."""
    if answer.remove:
        return {"namespace": row.namespace, "id": row.id, "status": "removed", "history": [], "aux_state": None, "timer": None, "error": None}
    created = format_time(now)
    return {
        **summary(row),
        "history": [{"id": i, "created_at": created, "data": data} for i, data in enumerate(answer.events, start=1)],
        "pending_notifications": 0,
        "failures": [],
    }


async def call_machine(ctx: Context, namespace: str, machine_id: str, args: Any, key: str | None = None, timeout_ms: int | None = None) -> Reply:
    """Run a ``call`` step and answer the processor's response."""
    return await _step(ctx, namespace, machine_id, "call", args, key, timeout_ms)


async def repair_machine(ctx: Context, namespace: str, machine_id: str, args: Any, key: str | None = None, simple: bool = False) -> Reply:
    """Bring a failed machine back to ``working``: through the processor's ``repair``, or at once when simple."""
    if not simple:
        return await _step(ctx, namespace, machine_id, "repair", args, key, None)
    replay = await _replay(ctx, namespace, machine_id, key, "repair")
    if replay is not None:
        return replay
    async with machine_lock(ctx, namespace, machine_id):
        _ns, row, _ = await _load(ctx, namespace, machine_id, HistoryRange(limit=1))
        if row.status != "failed":
            raise MachineAlreadyWorking(f"machine {machine_id!r} is working")
        async with ctx.store.transaction() as tx:
            result = await tx.execute(
                machines.update()
                .where(machines.c.uid == row.uid, machines.c.version == row.version)
                .values(status="working", error=None, version=row.version + 1, retry_attempt=0, retry_since=None, updated_at=ctx.now_ms())
            )
            if not result.rowcount:
                raise MachineBusy("the machine changed while it was repaired; try again")
            await journal(tx, row.uid, "repair", "repaired", "simple repair", permanent=False, attempt=0, outcome="repaired")
            await outbox.emit(tx, "machine.repaired", SUBJECT, subject_id(row), {"namespace": namespace, "id": machine_id, "simple": True})
            tx.notify(CHANNEL)
            body = {"response": None}
            await save_operation(tx, namespace, machine_id, key, "repair", 200, body)
    return Reply(200, body)


async def _step(ctx: Context, namespace: str, machine_id: str, kind: str, args: Any, key: str | None, timeout_ms: int | None) -> Reply:
    replay = await _replay(ctx, namespace, machine_id, key, kind)
    if replay is not None:
        return replay
    async with machine_lock(ctx, namespace, machine_id):
        for _attempt in range(ctx.settings.machines.conflict_retries + 1):
            ns, row, events = await _load(ctx, namespace, machine_id)
            if kind == "call" and row.status != "working":
                raise MachineFailed(f"machine {machine_id!r} is failed; repair it first")
            if kind == "repair" and row.status == "working":
                raise MachineAlreadyWorking(f"machine {machine_id!r} is working")
            try:
                answer = await _process(ctx, ns, kind, args, processor_view(row, events), timeout_ms)
            except ProcessorError as error:
                reply = await _step_failed(ctx, row, kind, error, key)
                if reply is None:
                    continue
                return reply
            try:
                body = await committer(ctx.extras, ctx.store).run(
                    lambda tx, row=row, answer=answer: _apply_step(ctx, tx, row, answer, kind, key)
                )
                if body is None:
                    continue
            except IntegrityError as exc:
                replay = await _replay(ctx, namespace, machine_id, key, kind) if ctx.store.dialect.is_unique_violation(exc) else None
                if replay is None:
                    raise
                return replay
            return Reply(200, body)
    raise MachineBusy("other steps kept changing the machine; try again")


async def _apply_step(ctx: Context, tx: Any, row: Any, answer: Answer, kind: str, key: str | None) -> dict[str, Any] | None:
    """Apply a call or repair answer in ``tx`` (a group commit); None when the machine moved on."""
    if not await apply_answer(tx, row, answer, repaired=kind == "repair"):
        return None
    tx.after_commit(lambda: note_version(ctx.extras, row.uid, row.version + 1))
    body = {"response": answer.response}
    await save_operation(tx, row.namespace, row.id, key, kind, 200, body)
    return body


async def _step_failed(ctx: Context, row: Any, kind: str, error: ProcessorError, key: str | None) -> Reply | None:
    """Record a failed call or repair; a permanent error on a call fails the machine. None: lost a race."""
    problem = _processor_error(error)
    async with ctx.store.transaction() as tx:
        if kind == "call" and error.permanent:
            if not await fail_machine(tx, row, kind, error, attempt=1):
                return None
            await save_operation(tx, row.namespace, row.id, key, kind, problem.status, problem.problem())
        else:
            # A transient error leaves the machine as it was; the journal still keeps it.
            still = (await tx.execute(select(machines.c.version).where(machines.c.uid == row.uid))).scalar()
            if still is None:
                raise MachineNotFound(f"no machine {row.id!r} in namespace {row.namespace!r}")
            await journal(tx, row.uid, kind, error.code, error.detail, permanent=error.permanent, attempt=1,
                          outcome="repair_failed" if kind == "repair" else "returned")
    raise problem


async def notify_machine(ctx: Context, namespace: str, machine_id: str, args: Any, key: str | None = None) -> Reply:
    """Queue a notification; it is delivered later, in order, at least once."""
    replay = await _replay(ctx, namespace, machine_id, key, "notify")
    if replay is not None:
        return replay
    notification_id = uuid.uuid4().hex
    try:
        async with ctx.store.transaction() as tx:
            now = ctx.now_ms()
            row = (
                await tx.execute(
                    ctx.store.dialect.for_update(select(machines.c.uid, machines.c.timer_at).where(machines.c.namespace == namespace, machines.c.id == machine_id))
                )
            ).first()
            if row is None:
                async with ctx.store.read() as conn:
                    await find_namespace(conn, ctx, namespace)
                raise MachineNotFound(f"no machine {machine_id!r} in namespace {namespace!r}")
            await tx.execute(notifications.insert().values(id=notification_id, machine_uid=row.uid, args=args, created_at=now, due_at=now, attempts=0))
            await refresh_notify_at(tx, row.uid)
            tx.notify(CHANNEL)
            body = {"id": notification_id}
            await save_operation(tx, namespace, machine_id, key, "notify", 202, body)
    except IntegrityError as exc:
        replay = await _replay(ctx, namespace, machine_id, key, "notify") if ctx.store.dialect.is_unique_violation(exc) else None
        if replay is None:
            raise
        return replay
    return Reply(202, body)


async def get_machine(ctx: Context, namespace: str, machine_id: str, rng: HistoryRange) -> dict[str, Any]:
    async with ctx.store.read() as conn:
        await find_namespace(conn, ctx, namespace)
        row = (await conn.execute(select(machines).where(machines.c.namespace == namespace, machines.c.id == machine_id))).first()
        if row is None:
            raise MachineNotFound(f"no machine {machine_id!r} in namespace {namespace!r}")
        return await machine_to_api(conn, ctx, row, rng)


async def machine_to_api(conn: Any, ctx: Context, row: Any, rng: HistoryRange) -> dict[str, Any]:
    journal_rows = (
        await conn.execute(
            select(failures).where(failures.c.machine_uid == row.uid).order_by(failures.c.seq.desc()).limit(ctx.settings.machines.journal_in_get)
        )
    ).all()
    return {
        **summary(row),
        "history": await read_history(conn, row, rng),
        "pending_notifications": await count_pending(conn, row.uid),
        "failures": [
            {"at": format_time(f.at), "kind": f.kind, "code": f.code, "detail": f.detail, "permanent": f.permanent, "attempt": f.attempt, "outcome": f.outcome}
            for f in reversed(journal_rows)
        ],
    }


def summary(row: Any) -> dict[str, Any]:
    return {
        "namespace": row.namespace,
        "id": row.id,
        "status": row.status,
        "version": row.version,
        "last_event_id": row.last_event_id,
        "aux_state": row.aux_state,
        "timer": format_time(row.timer_at),
        "error": row.error,
        "created_at": format_time(row.created_at),
        "updated_at": format_time(row.updated_at),
    }


async def remove_machine(ctx: Context, namespace: str, machine_id: str) -> None:
    """Remove a machine with its whole history."""
    async with ctx.store.transaction() as tx:
        # Lock the machine before its children, in the order a step takes them, so the two cannot deadlock.
        query = select(machines).where(machines.c.namespace == namespace, machines.c.id == machine_id)
        row = (await tx.execute(ctx.store.dialect.for_update(query))).first()
        if row is None:
            raise MachineNotFound(f"no machine {machine_id!r} in namespace {namespace!r}")
        await remove_machine_rows(tx, row)


async def list_machines(ctx: Context, namespace: str, status: str | None, limit: int, cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
    query = select(machines).where(machines.c.namespace == namespace).order_by(machines.c.id).limit(limit + 1)
    if status is not None:
        query = query.where(machines.c.status == status)
    if cursor:
        (after,) = decode_cursor(cursor, 1)
        query = query.where(machines.c.id > str(after))
    async with ctx.store.read() as conn:
        await find_namespace(conn, ctx, namespace)
        rows = (await conn.execute(query)).all()
    next_cursor = encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    return [summary(r) for r in rows[:limit]], next_cursor


async def get_operation(ctx: Context, namespace: str, machine_id: str, key: str) -> dict[str, Any]:
    async with ctx.store.read() as conn:
        row = (
            await conn.execute(
                select(operations).where(operations.c.namespace == namespace, operations.c.machine_id == machine_id, operations.c.key == key)
            )
        ).first()
    if row is None:
        raise OperationNotFound(f"no operation with key {key!r} took effect on machine {machine_id!r}")
    return {"key": row.key, "kind": row.kind, "status": row.status_code, "response": row.body, "created_at": format_time(row.created_at)}
