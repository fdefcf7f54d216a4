"""The machines face's domain functions: Start, Call, Notify, Repair, Get, Remove, list, operations, and the
reads the dashboard shows.

A step reads the machine, calls the processor outside any transaction, then applies the answer in a group
commit guarded by the version it read (see ``steps``). A lost race is re-run from a fresh read. Statements
are in ``data``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict, TypeVar, cast

from mainspring.core import outbox
from mainspring.core.data import Alert
from mainspring.core.errors import MainspringError
from mainspring.core.paging import encode_cursor, machine_id_cursor
from mainspring.core.runtime import Context
from mainspring.machines import data, metrics
from mainspring.machines.data import Applied, FailureRow, MachineRow, NotificationRow, OperationRow
from mainspring.machines.errors import (
    DeadlineReached,
    IdempotencyKeyReused,
    MachineAlreadyExists,
    MachineAlreadyWorking,
    MachineBusy,
    MachineFailed,
    MachineNotFound,
    OperationNotFound,
    ProcessorFailed,
    ProcessorRefused,
    ProcessorTimeout,
)
from mainspring.machines.namespaces import (
    Namespace,
    find_namespace,
    local_target,
    namespace_of,
    processor_for,
)
from mainspring.machines.processor import UNSET, Answer, Origin, ProcessorError, Step
from mainspring.machines.retry import next_delay_ms
from mainspring.machines.settings import STORAGE_RETRY, HistoryRange, RetryPolicy
from mainspring.machines.steps import (
    CHANNEL,
    SUBJECT,
    HistoryEvent,
    ProcessorView,
    applied_once,
    event_of_each,
    fail_machine,
    history_to_api,
    journal,
    note_version,
    pending_step,
    processor_view,
)
from mainspring.machines.steps import (
    remove_machine as remove_machine_rows,
)
from mainspring.store import Transaction, format_time
from mainspring.store.dialect import Executor
from mainspring.store.errors import is_unavailable
from mainspring.types import JsonData, JsonObject

log = logging.getLogger("mainspring.machines")


@dataclass
class Reply:
    """An HTTP answer a repeat with the same Idempotency-Key gets back unchanged."""

    status: int
    body: JsonObject


class FailureView(TypedDict):
    at: str | None
    kind: str
    code: str
    detail: str
    permanent: bool
    attempt: int
    outcome: str


class MachineSummary(TypedDict):
    namespace: str
    id: str
    status: str
    version: int
    last_event_id: int
    aux_state: JsonData
    timer: str | None
    error: JsonObject | None
    created_at: str | None
    updated_at: str | None


class MachineView(MachineSummary):
    """A machine as Get shows it."""

    history: list[HistoryEvent]
    pending_notifications: int
    failures: list[FailureView]


class MachineListed(TypedDict):
    namespace: str
    id: str
    status: str
    timer: str | None
    updated_at: str | None


class NotificationView(TypedDict):
    id: str
    args: JsonData
    created_at: str | None
    due_at: str | None
    attempts: int


class OperationView(TypedDict):
    key: str
    kind: str
    status: int
    response: JsonObject
    created_at: str | None


LOCKS = "machines:locks"


def machine_lock(ctx: Context, namespace: str, machine_id: str) -> asyncio.Lock:
    """Steps of one machine on this server queue here instead of racing each other to the version check."""
    locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = ctx.extras.setdefault(LOCKS, weakref.WeakValueDictionary())
    key = (namespace, machine_id)
    lock = locks.get(key)
    if lock is None:
        lock = locks[key] = asyncio.Lock()
    return lock


def _not_found(namespace: str, machine_id: str) -> MachineNotFound:
    return MachineNotFound(f"no machine {machine_id!r} in namespace {namespace!r}")


def _processor_error(error: ProcessorError) -> MainspringError:
    """What the caller is answered: a permanent refusal (502 processor_refused) or a transient failure (502
    processor_failed / 504 processor_timeout), which a client may retry."""
    if error.permanent:
        return ProcessorRefused(error.detail)
    # What the processor raised or where it lives is for the operator (the log), not for whoever called.
    log.warning("a processor call failed: %s", error.detail)
    if error.timeout:
        return ProcessorTimeout("the processor did not answer in time (the server log has more)")
    return ProcessorFailed("the processor failed (the server log has what it raised)")


async def _replay(ctx: Context, namespace: str, machine_id: str, key: str | None, kind: str) -> Reply | None:
    if key is None:
        return None
    async with ctx.store.read() as conn:
        found = await data.get_operation(conn, namespace, machine_id, key)
    if found is None:
        return None
    if found.kind != kind:
        raise IdempotencyKeyReused(f"key {key!r} was used for a {found.kind}, not a {kind}")
    return Reply(found.status_code, found.body)


async def _save_operation(tx: Transaction, namespace: str, machine_id: str, key: str | None, kind: str, status: int, body: JsonObject) -> None:
    """Remember an idempotent operation's answer; a second insert of the key fails the whole step."""
    if key is not None:
        await data.insert_operation(tx, OperationRow(namespace, machine_id, key, kind, status, body, tx.store.now_ms()))


async def _history(conn: Executor, machine: MachineRow, rng: HistoryRange) -> list[HistoryEvent]:
    events = await data.read_history(conn, machine, rng.after, rng.limit, rng.direction == "backward")
    return history_to_api(events)


@dataclass(frozen=True, slots=True)
class _Wanted:
    """One step's read: the machine, and the history range its processor is sent (None: the namespace's)."""

    namespace: str
    machine_id: str
    rng: HistoryRange | None


Loaded = tuple[Namespace, MachineRow, list[data.HistoryRow]]


async def _load(ctx: Context, namespace: str, machine_id: str, rng: HistoryRange | None = None) -> Loaded:
    """The machine with its namespace and the part of its history the processor is sent, read together with
    the other steps' reads arriving at the same moment (two statements for all of them)."""
    loaded = await ctx.store.read_batched(("machines.load", id(ctx)), lambda conn, wanted: _load_all(ctx, conn, wanted), _Wanted(namespace, machine_id, rng))
    if loaded is None:
        async with ctx.store.read() as conn:
            await find_namespace(conn, ctx, namespace)  # namespace_not_found first
        raise _not_found(namespace, machine_id)
    return loaded


async def _load_all(ctx: Context, conn: Executor, wanted: list[_Wanted]) -> list[Loaded | MainspringError | None]:
    """Per read: the machine, its namespace and history; None: no such machine; an error: raised to that reader."""
    found = await data.machines_and_namespaces(conn, [(w.namespace, w.machine_id) for w in wanted])
    answers: list[Loaded | MainspringError | None] = []
    whole: list[MachineRow] = []
    for w in wanted:
        machine, stored = found.get((w.namespace, w.machine_id), (None, None))
        if machine is None:
            answers.append(None)
            continue
        try:
            ns = namespace_of(ctx, w.namespace, stored)
        except MainspringError as error:
            answers.append(error)
            continue
        answers.append((ns, machine, []))
        rng = w.rng or ns.config.history
        if rng.after is None and rng.limit is None and rng.direction == "forward":
            whole.append(machine)
    histories = await data.whole_histories(conn, whole)
    for i, (w, answer) in enumerate(zip(wanted, answers, strict=True)):
        if isinstance(answer, tuple):
            ns, machine, _ = answer
            rng = w.rng or ns.config.history
            if machine.uid in histories and rng.after is None and rng.limit is None and rng.direction == "forward":
                answers[i] = (ns, machine, histories[machine.uid])
            else:
                answers[i] = (ns, machine, await data.read_history(conn, machine, rng.after, rng.limit, rng.direction == "backward"))
    return answers


async def _process(ctx: Context, ns: Namespace, kind: str, args: JsonData, view: ProcessorView, timeout_ms: int | None = None, step: Step | None = None) -> Answer:
    """Ask the processor; a transient failure is retried here only by the namespace's ``retries.processor``
    policy (Machinegun's processor policy), never past the call's timeout. Without one it is answered at once."""
    processor = processor_for(ctx, ns)
    policy = ns.config.retries.processor
    budget_ms = timeout_ms or ns.timeout_ms
    started = ctx.now_ms()
    deadline_ms = step.origin.deadline_ms if step is not None and step.origin is not None else None
    if deadline_ms is not None:
        budget_ms = min(budget_ms, _before_deadline(ctx, deadline_ms))
    for attempt in itertools.count(1):
        left_ms = budget_ms - (ctx.now_ms() - started)
        try:
            answer = await processor.process(kind, args, view, max(1, left_ms), ctx.now_ms(), step=step)
            if deadline_ms is not None:
                _before_deadline(ctx, deadline_ms)  # the caller has gone: its answer is not written
            return answer
        except ProcessorError as error:
            delay = None if policy is None or error.permanent else next_delay_ms(policy, attempt, ctx.now_ms() - started)
            if delay is None or ctx.now_ms() - started + delay >= budget_ms:
                raise
            await asyncio.sleep(delay / 1000)
    raise AssertionError("unreachable")


def _before_deadline(ctx: Context, deadline_ms: int) -> int:
    """What is left of a caller's deadline; DeadlineReached once it has passed."""
    left = deadline_ms - ctx.now_ms()
    if left <= 0:
        raise DeadlineReached("the caller's woody.deadline passed; nothing was written")
    return left


T = TypeVar("T")


@dataclass
class StorageRetries:
    """Machinegun's ``storage`` retry policy for one call: store work that failed because the store was
    unreachable is run again, until the policy is spent or the call's budget runs out. Every store touch of
    a method made over Machinegun's protocol goes through ``run``; the processor is outside it, so a retry
    never calls it again."""

    policy: RetryPolicy | None
    """None: no retries (a JSON API call, answered 503 at once; its client retries with its Idempotency-Key)."""
    until_ms: int
    """The caller's deadline (or its processor timeout from the start), on the server's clock."""
    failures: int = 0
    started: float | None = None
    """When the first failure happened (``time.monotonic``): the policy's ``max_total_ms`` counts from it."""

    async def run(self, ctx: Context, work: Callable[[], Awaitable[T]]) -> T:
        if self.policy is None:
            return await work()
        while True:
            try:
                return await work()
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                self.failures += 1
                if self.started is None:
                    self.started = time.monotonic()
                spent_ms = int((time.monotonic() - self.started) * 1000)
                delay = next_delay_ms(self.policy, self.failures, spent_ms)
                if delay is None or ctx.now_ms() + delay >= self.until_ms:
                    raise
                await asyncio.sleep(delay / 1000)


def storage_retries(ctx: Context, namespace: str, origin: Origin | None) -> StorageRetries:
    """The storage retries of a call made over Machinegun's protocol (``origin``; None: a JSON API call, not
    retried). The policy is the configured namespace's (read from the settings: the store may be the thing
    that is down), else Machinegun's default."""
    if origin is None:
        return StorageRetries(None, 0)
    configured = ctx.settings.machines.namespaces.get(namespace)
    policy = configured.retries.storage if configured is not None and configured.retries.storage is not None else STORAGE_RETRY
    timeout = configured.processor.timeout_ms if configured is not None else 30_000
    until = origin.deadline_ms if origin.deadline_ms is not None else ctx.now_ms() + timeout
    return StorageRetries(policy, until)


async def _written_by(ctx: Context, retries: StorageRetries, namespace: str, machine_id: str, before: MachineRow | None, answer: Answer,
                      updated_at: int | None = None) -> JsonObject | None:
    """The machine as Get shows it when its newest step is ``answer`` applied to ``before`` (None: the
    ``init`` that created it), written at ``updated_at`` when given; None otherwise. A commit whose answer
    was lost with the store is recognised by this on the retry, and answered as done."""
    after = None if before is None else before.last_event_id
    try:
        machine = await retries.run(ctx, functools.partial(get_machine, ctx, namespace, machine_id, HistoryRange(after=after)))
    except MachineNotFound:
        return _removed_body(namespace, machine_id) if answer.remove else None
    version = 0 if before is None else before.version
    aux_state = (None if before is None else before.aux_state) if answer.aux_state is UNSET else answer.aux_state
    if (machine["version"] != version + 1 or [e["data"] for e in machine["history"]] != answer.events or machine["aux_state"] != aux_state
            or (updated_at is not None and machine["updated_at"] != format_time(updated_at))):
        return None
    return cast(JsonObject, machine)  # a JSON object, which mypy sees in no TypedDict


# --- Start --------------------------------------------------------------------------------------------------


async def start_machine(ctx: Context, namespace: str, machine_id: str, args: JsonData, key: str | None = None, origin: Origin | None = None) -> Reply:
    """Create a machine with the processor's ``init`` answer; nothing is created when the processor fails
    (or ``origin``'s deadline passes first)."""
    replay = await _replay(ctx, namespace, machine_id, key, "start")
    if replay is not None:
        return replay
    retries = storage_retries(ctx, namespace, origin)

    async def read() -> tuple[data.NamespaceRow | None, bool]:
        async with ctx.store.read() as conn:
            return await data.namespace_and_taken(conn, namespace, machine_id)

    stored, taken = await retries.run(ctx, read)
    ns = namespace_of(ctx, namespace, stored)
    if taken:
        raise MachineAlreadyExists(f"machine {machine_id!r} already exists in namespace {namespace!r}")
    view: ProcessorView = {"namespace": namespace, "id": machine_id, "status": "working", "history": [], "aux_state": None}
    try:
        answer = await _process(ctx, ns, "init", args, view, step=Step(ns.config.history, origin=origin))
    except ProcessorError as error:
        metrics.count_processor_error(namespace, "init", error.code)
        raise _processor_error(error) from error
    failures = retries.failures
    try:
        body = await retries.run(ctx, lambda: ctx.store.grouped(lambda tx: _create(tx, namespace, machine_id, answer, key)))
    except Exception as exc:
        if not ctx.store.dialect.is_unique_violation(exc):
            raise
        replay = await _replay(ctx, namespace, machine_id, key, "start")
        if replay is not None:
            return replay
        if retries.failures > failures:
            # A commit whose answer was lost with the store: the machine there may be this very Start's.
            mine = await _written_by(ctx, retries, namespace, machine_id, None, answer)
            if mine is not None:
                return Reply(201, mine)
        raise MachineAlreadyExists(f"machine {machine_id!r} already exists in namespace {namespace!r}") from exc
    return Reply(201, body)


async def _create(tx: Transaction, namespace: str, machine_id: str, answer: Answer, key: str | None) -> JsonObject:
    """Write a new machine from its ``init`` answer (a group commit's work)."""
    now = tx.store.now_ms()
    timer_at = answer.timer_at if isinstance(answer.timer_at, int) else None
    aux_state = None if answer.aux_state is UNSET else answer.aux_state
    timer_range = answer.timer_range.model_dump() if timer_at is not None and answer.timer_range is not None else None
    timer_timeout_ms = answer.timer_timeout_ms if timer_at is not None else None
    machine = await data.insert_machine(tx, namespace, machine_id, aux_state, timer_at, len(answer.events), now, timer_range, timer_timeout_ms)
    metrics.count_step(tx, namespace, "init")
    await data.insert_history(tx, machine.uid, 1, answer.events, now)
    await outbox.emit_many(tx, [outbox.Event("machine.created", SUBJECT, machine.subject, {"namespace": namespace, "id": machine_id}),
                                *event_of_each(machine, answer.events, 1)])
    if answer.remove:
        await remove_machine_rows(tx, machine)
    elif timer_at is not None:
        tx.notify(CHANNEL)
    body = _created_body(machine, answer, now)
    await _save_operation(tx, namespace, machine_id, key, "start", 201, body)
    return body


def _created_body(machine: MachineRow, answer: Answer, now: int) -> JsonObject:
    """The new machine as Get would show it, built from what the step just wrote (no re-read)."""
    if answer.remove:
        return _removed_body(machine.namespace, machine.id)
    created = format_time(now)
    view: MachineView = {
        **summary(machine),
        "history": [{"id": i, "created_at": created, "data": event} for i, event in enumerate(answer.events, start=1)],
        "pending_notifications": 0,
        "failures": [],
    }
    return cast(JsonObject, view)  # a JSON object, which mypy sees in no TypedDict


def _removed_body(namespace: str, machine_id: str) -> JsonObject:
    return {"namespace": namespace, "id": machine_id, "status": "removed", "history": [], "aux_state": None, "timer": None, "error": None}


# --- Call and Repair ----------------------------------------------------------------------------------------


async def call_machine(
    ctx: Context, namespace: str, machine_id: str, args: JsonData, key: str | None = None, timeout_ms: int | None = None, rng: HistoryRange | None = None,
    origin: Origin | None = None,
) -> Reply:
    """Run a ``call`` step and answer the processor's response; ``rng``: the history the processor is sent
    (None: the namespace's range); ``origin``: the woody caller, whose deadline bounds the step."""
    return await _step(ctx, namespace, machine_id, "call", args, key, timeout_ms, rng, origin)


async def repair_machine(
    ctx: Context, namespace: str, machine_id: str, args: JsonData, key: str | None = None, simple: bool = False, rng: HistoryRange | None = None,
    origin: Origin | None = None,
) -> Reply:
    """Bring a failed machine back to ``working``: through the processor's ``repair``, or at once when simple."""
    if not simple:
        return await _step(ctx, namespace, machine_id, "repair", args, key, None, rng, origin)
    replay = await _replay(ctx, namespace, machine_id, key, "repair")
    if replay is not None:
        return replay
    retries = storage_retries(ctx, namespace, origin)
    body: JsonObject = {"response": None}
    async with machine_lock(ctx, namespace, machine_id):
        _ns, machine, _ = await retries.run(ctx, functools.partial(_load, ctx, namespace, machine_id, HistoryRange(limit=1)))
        if machine.status != "failed":
            raise MachineAlreadyWorking(f"machine {machine_id!r} is working")
        if origin is not None and origin.deadline_ms is not None:
            _before_deadline(ctx, origin.deadline_ms)
        now = ctx.now_ms()

        async def repair() -> None:
            async with ctx.store.transaction() as tx:
                if not await data.mark_repaired(tx, machine, now):
                    raise MachineBusy("the machine changed while it was repaired; try again")
                await journal(tx, machine.uid, "repair", "repaired", "simple repair", permanent=False, attempt=0, outcome="repaired")
                await outbox.emit(tx, "machine.repaired", SUBJECT, machine.subject, {"namespace": namespace, "id": machine_id, "simple": True})
                tx.notify(CHANNEL)
                await _save_operation(tx, namespace, machine_id, key, "repair", 200, body)

        failures = retries.failures
        try:
            await retries.run(ctx, repair)
        except MachineBusy:
            if retries.failures == failures or await _written_by(ctx, retries, namespace, machine_id, machine, Answer(), now) is None:
                raise
    return Reply(200, body)


async def _step(ctx: Context, namespace: str, machine_id: str, kind: str, args: JsonData, key: str | None, timeout_ms: int | None, rng: HistoryRange | None = None,
                origin: Origin | None = None) -> Reply:
    replay = await _replay(ctx, namespace, machine_id, key, kind)
    if replay is not None:
        return replay
    retries = storage_retries(ctx, namespace, origin)
    async with machine_lock(ctx, namespace, machine_id):
        for _attempt in range(ctx.settings.machines.conflict_retries + 1):
            ns, machine, events = await retries.run(ctx, functools.partial(_load, ctx, namespace, machine_id, rng))
            if kind == "call" and machine.status != "working":
                raise MachineFailed(f"machine {machine_id!r} is failed; repair it first")
            if kind == "repair" and machine.status == "working":
                raise MachineAlreadyWorking(f"machine {machine_id!r} is working")
            try:
                answer = await _process(ctx, ns, kind, args, processor_view(machine, events), timeout_ms, Step(rng or ns.config.history, machine.timer_at, origin))
            except ProcessorError as error:
                metrics.count_processor_error(namespace, kind, error.code)
                # The failure is recorded under the storage retries, and raised outside them: a processor's
                # error can have a connection error as its cause, which is not the store's.
                if not await retries.run(ctx, functools.partial(_record_failure, ctx, machine, kind, error, key)):
                    continue
                raise _processor_error(error) from error  # the cause tells the Machinegun face whether it was permanent
            body: JsonObject = {"response": answer.response}
            operation = None if key is None else OperationRow(namespace, machine_id, key, kind, 200, body, ctx.now_ms())
            now = ctx.now_ms()
            step = pending_step(machine, answer, now, repaired=kind == "repair", operation=operation)
            failures = retries.failures
            try:
                outcome = await retries.run(ctx, functools.partial(applied_once, ctx.store, step))
            except Exception as exc:
                replay = await _replay(ctx, namespace, machine_id, key, kind) if ctx.store.dialect.is_unique_violation(exc) else None
                if replay is None:
                    raise
                return replay
            if (outcome is Applied.MOVED_ON and retries.failures > failures
                    and await _written_by(ctx, retries, namespace, machine_id, machine, answer, now) is not None):
                outcome = Applied.APPLIED  # an earlier try committed; its answer was lost with the store
            if outcome is not Applied.APPLIED:
                continue
            note_version(ctx.extras, machine.uid, machine.version + 1)
            metrics.step_applied(namespace, kind)
            return Reply(200, body)
    raise MachineBusy("other steps kept changing the machine; try again")


async def _record_failure(ctx: Context, machine: MachineRow, kind: str, error: ProcessorError, key: str | None) -> bool:
    """Record a failed call or repair; a permanent error on a call fails the machine. False: lost a race."""
    async with ctx.store.transaction() as tx:
        if kind == "call" and error.permanent:
            if not await fail_machine(tx, machine, kind, error, attempt=1):
                return False
            problem = _processor_error(error)
            await _save_operation(tx, machine.namespace, machine.id, key, kind, problem.status, cast(JsonObject, problem.problem()))  # JSON, built here
        else:
            # A transient error leaves the machine as it was; the journal still keeps it.
            if await data.current_version(tx, machine.uid) is None:
                raise _not_found(machine.namespace, machine.id)
            await journal(tx, machine.uid, kind, error.code, error.detail, permanent=error.permanent, attempt=1,
                          outcome="repair_failed" if kind == "repair" else "returned")
    return True


# --- Notify -------------------------------------------------------------------------------------------------


async def notify_machine(ctx: Context, namespace: str, machine_id: str, args: JsonData, key: str | None = None, rng: HistoryRange | None = None,
                         origin: Origin | None = None) -> Reply:
    """Queue a notification; it is delivered later, in order, at least once. ``rng``: the history its step
    is sent (None: the namespace's range); nothing is queued once ``origin``'s deadline has passed."""
    replay = await _replay(ctx, namespace, machine_id, key, "notify")
    if replay is not None:
        return replay
    notification_id = uuid.uuid4().hex
    body: JsonObject = {"id": notification_id}
    retries = storage_retries(ctx, namespace, origin)

    async def queue() -> None:
        async with ctx.store.transaction() as tx:
            machine = await data.lock_machine(tx, namespace, machine_id)
            if machine is None:
                async with ctx.store.read() as conn:
                    await find_namespace(conn, ctx, namespace)
                raise _not_found(namespace, machine_id)
            if origin is not None and origin.deadline_ms is not None:
                _before_deadline(ctx, origin.deadline_ms)
            await data.insert_notification(tx, notification_id, machine.uid, args, ctx.now_ms(), None if rng is None else rng.model_dump())
            tx.notify(CHANNEL)
            await _save_operation(tx, namespace, machine_id, key, "notify", 202, body)

    failures = retries.failures
    try:
        await retries.run(ctx, queue)
    except Exception as exc:
        if not ctx.store.dialect.is_unique_violation(exc):
            raise
        if retries.failures > failures:
            # The notification's id is this call's own: an earlier try committed and its answer was lost.
            return Reply(202, body)
        replay = await _replay(ctx, namespace, machine_id, key, "notify")
        if replay is None:
            raise
        return replay
    return Reply(202, body)


# --- Modernize ----------------------------------------------------------------------------------------------


async def rewrite_event(ctx: Context, namespace: str, machine_id: str, event_id: int, data_: JsonData, origin: Origin | None = None) -> bool:
    """Replace one event's data (what Machinegun's Modernizer answered), with its ``machine.event_modernized``
    event; False when the machine or the event is gone. A retry after a lost commit writes the same data
    again (and its event once more: at least once)."""

    async def rewrite() -> bool:
        async with ctx.store.transaction() as tx:
            machine = await data.lock_machine(tx, namespace, machine_id)
            if machine is None or not await data.replace_event(tx, machine.uid, event_id, data_):
                return False
            await outbox.emit(tx, "machine.event_modernized", SUBJECT, machine.subject,
                              {"namespace": namespace, "id": machine_id, "event_id": event_id, "data": data_})
        return True

    return await storage_retries(ctx, namespace, origin).run(ctx, rewrite)


# --- Get, list, Remove, operations --------------------------------------------------------------------------


async def get_machine(ctx: Context, namespace: str, machine_id: str, rng: HistoryRange, origin: Origin | None = None) -> MachineView:
    """The machine with a range of its history, its pending notifications and its newest failures (read
    again while the store is unreachable when ``origin`` is a woody caller).

    The row and its pending count come from one statement (one snapshot) and the history is bounded by that
    row, so a notification is always shown either pending or in the history, never neither."""
    if origin is not None:
        return await storage_retries(ctx, namespace, origin).run(ctx, functools.partial(get_machine, ctx, namespace, machine_id, rng))
    async with ctx.store.read() as conn:
        found = await data.machine_with_pending(conn, namespace, machine_id)
        if found is None:
            await find_namespace(conn, ctx, namespace)
            raise _not_found(namespace, machine_id)
        machine, pending = found
        if local_target(ctx, namespace) is None:  # an in-process namespace exists whether stored or not
            await find_namespace(conn, ctx, namespace)
        journal_rows = await data.recent_failures(conn, machine.uid, ctx.settings.machines.journal_in_get)
        events = await _history(conn, machine, rng)
    return {**summary(machine), "history": events, "pending_notifications": pending, "failures": [failure_to_api(f) for f in journal_rows]}


def failure_to_api(failure: FailureRow) -> FailureView:
    return {"at": format_time(failure.at), "kind": failure.kind, "code": failure.code, "detail": failure.detail,
            "permanent": failure.permanent, "attempt": failure.attempt, "outcome": failure.outcome}


def summary(machine: MachineRow) -> MachineSummary:
    return {
        "namespace": machine.namespace,
        "id": machine.id,
        "status": machine.status,
        "version": machine.version,
        "last_event_id": machine.last_event_id,
        "aux_state": machine.aux_state,
        "timer": format_time(machine.timer_at),
        "error": machine.error,
        "created_at": format_time(machine.created_at),
        "updated_at": format_time(machine.updated_at),
    }


async def remove_machine(ctx: Context, namespace: str, machine_id: str, origin: Origin | None = None) -> None:
    """Remove a machine with its whole history."""
    found = False

    async def remove() -> None:
        nonlocal found
        async with ctx.store.transaction() as tx:
            # Lock the machine before its children, in the order a step takes them, so the two cannot deadlock.
            machine = await data.lock_machine(tx, namespace, machine_id)
            if machine is None:
                if found:  # an earlier try removed it and its answer was lost with the store
                    return
                raise _not_found(namespace, machine_id)
            found = True
            await remove_machine_rows(tx, machine)

    await storage_retries(ctx, namespace, origin).run(ctx, remove)


async def list_machines(ctx: Context, namespace: str, status: str | None, limit: int, cursor: str | None) -> tuple[list[MachineSummary], str | None]:
    after = None
    if cursor:
        after = machine_id_cursor(cursor)
    async with ctx.store.read() as conn:
        await find_namespace(conn, ctx, namespace)
        found = await data.list_machines(conn, namespace, status, after, limit + 1)
    next_cursor = encode_cursor(found[limit - 1].id) if len(found) > limit else None
    return [summary(m) for m in found[:limit]], next_cursor


async def get_operation(ctx: Context, namespace: str, machine_id: str, key: str) -> OperationView:
    async with ctx.store.read() as conn:
        found = await data.get_operation(conn, namespace, machine_id, key)
    if found is None:
        raise OperationNotFound(f"no operation with key {key!r} took effect on machine {machine_id!r}")
    return {"key": found.key, "kind": found.kind, "status": found.status_code, "response": found.body, "created_at": format_time(found.created_at)}


# --- what the dashboard shows -------------------------------------------------------------------------------


async def namespace_names(ctx: Context) -> list[str]:
    """Every namespace: stored, used by a machine, configured, or bound to an in-process processor."""
    async with ctx.store.read() as conn:
        known = await data.namespace_names(conn)
    return sorted(known | set(ctx.settings.machines.namespaces) | set(getattr(ctx.registry, "processors", {})))


async def search_machines(ctx: Context, status: str | None, id_part: str | None, limit: int, namespace: str | None = None) -> list[MachineListed]:
    """Machines of every namespace (or one) whose id contains ``id_part`` (the API lists one namespace at a time)."""
    async with ctx.store.read() as conn:
        found = await data.search_machines(conn, status, id_part, limit, namespace)
    return [{"namespace": m.namespace, "id": m.id, "status": m.status, "timer": format_time(m.timer_at), "updated_at": format_time(m.updated_at)} for m in found]


async def pending_notifications(ctx: Context, namespace: str, machine_id: str, limit: int = 50) -> list[NotificationView]:
    """The notifications waiting for a machine, oldest (next) first."""
    async with ctx.store.read() as conn:
        found = await data.pending_notifications(conn, namespace, machine_id, limit)
    return [notification_to_api(n) for n in found]


def notification_to_api(notification: NotificationRow) -> NotificationView:
    return {"id": notification.id, "args": notification.args, "created_at": format_time(notification.created_at),
            "due_at": format_time(notification.due_at), "attempts": notification.attempts}


async def namespace_counts(ctx: Context, namespace: str) -> dict[str, int]:
    """The machines of one namespace counted by status (working and failed always present)."""
    async with ctx.store.read() as conn:
        counted = await data.count_by_namespace_and_status(conn, namespace)
    return {"working": 0, "failed": 0, **{status: n for _, status, n in counted}}


async def count_by_status(ctx: Context) -> dict[str, int]:
    """Machines counted by status."""
    async with ctx.store.read() as conn:
        return await data.count_by_status(conn)


async def fixed_alerts(conn: Executor, raised: Sequence[Alert]) -> dict[str, str]:
    """Of these open ``machine_failed`` alerts, those whose machine works again or is gone → why. An alert
    whose subject names no machine (a hashed one, see ``data.machine_subject``) is closed by hand."""
    named = {a.id: data.subject_machine(a.subject_id) for a in raised}
    statuses = await data.statuses_of(conn, [key for key in named.values() if key is not None])
    fixed: dict[str, str] = {}
    for alert in raised:
        key = named[alert.id]
        if key is None:
            continue
        status = statuses.get(key)
        if status is None:
            fixed[alert.id] = "machine removed"
        elif status == "working":
            fixed[alert.id] = "machine repaired"
    return fixed
