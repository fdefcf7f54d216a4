"""Workflows' domain functions (API.md §5): start, read, list, signal, cancel, retry — each a step of the run's
machine through ``machines.driven`` — and the watcher that turns a task's end into a notification of its run."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TypedDict, cast

from mainspring.core import finishes, outbox
from mainspring.core.leases import new_token
from mainspring.core.paging import encode_cursor, machine_id_cursor
from mainspring.core.runtime import Context
from mainspring.machines import data as machines_data
from mainspring.machines import driven
from mainspring.machines.data import MachineRow, machine_subject
from mainspring.store import Transaction
from mainspring.types import JsonData, JsonObject
from mainspring.workflows import records
from mainspring.workflows.errors import RunFinished, RunNotFailed, RunNotFound, WorkflowNotFound
from mainspring.workflows.records import FINISHED_STATUSES, SUBJECT, RunAux, RunView, run_to_api
from mainspring.workflows.runner import FINISHED, INPUTS, runner_of

__all__ = ["RunFinished", "RunNotFound", "WorkflowNotFound"]

STATUSES = ("running", "sleeping", "waiting", "completed", "failed", "cancelled")


async def store_namespaces(ctx: Context) -> None:
    """Store the namespace of each registered workflow, its processor timeout the runs' lease: a server that dies
    holding a run it was handed lets it go after ``workflows.lease_ms``, not a processor's 30 s."""
    lease_ms = ctx.settings.workflows.lease_ms
    for name in workflow_names(ctx):
        await driven.store_namespace(ctx.store, name, lease_ms)


def workflow_names(ctx: Context) -> list[str]:
    return sorted(getattr(ctx.registry, "workflows", {}))


def _known(ctx: Context, name: str) -> None:
    if name not in getattr(ctx.registry, "workflows", {}):
        raise WorkflowNotFound(f"no workflow {name!r} is registered on this server")


def _status(machine: MachineRow) -> str:
    aux = machine.aux_state if isinstance(machine.aux_state, dict) else {}
    return "failed" if machine.status == "failed" else str(aux.get("status", "running"))


# --- start ----------------------------------------------------------------------------------------------------------


async def start_run(ctx: Context, name: str, run_id: str, args: JsonData) -> tuple[RunView, bool]:
    """Start run ``run_id`` of ``name`` (answers it and True), or answer the existing one whatever its status (and
    False): start is idempotent by id."""
    machine, created = await _start(ctx, name, run_id, args, None)
    if created:
        return run_to_api(machine, args, [driven.HistoryRow(machine.uid, 1, machine.created_at, {"wf": "start", "args": args})]), True
    return await get_run(ctx, name, run_id), False


async def start_or_join(ctx: Context, name: str, run_id: str, args: JsonData, watcher: list[JsonData]) -> RunView:
    """A child: start it with ``watcher`` (told when it ends), or have the existing run tell ``watcher`` too;
    answers the run as it is (finished: the watcher need not wait)."""
    machine, created = await _start(ctx, name, run_id, args, watcher)
    if created:
        return run_to_api(machine, args, None)
    if _status(machine) in FINISHED_STATUSES:
        return run_to_api(machine, None, None)
    async with ctx.store.transaction() as tx:
        held = await driven.lock(tx, name, run_id)
        if held is None:
            raise RunNotFound(f"no run {run_id!r} of workflow {name!r}")
        await driven.notify_in(tx, held, {"watch": watcher})
    return run_to_api(machine, None, None)


async def _start(ctx: Context, name: str, run_id: str, args: JsonData, watcher: list[JsonData] | None) -> tuple[MachineRow, bool]:
    _known(ctx, name)
    # No look first: a new run costs its insert alone, and a start of an existing run (a client's retry, a child
    # joined again) meets the unique id and reads it then (its group commit is rerun one write at a time).
    lease_ms = ctx.settings.workflows.lease_ms
    aux: JsonObject = {"status": "running", "waiting_for": None, "result": None, "error": None, **({"watchers": [watcher]} if watcher else {})}

    started = outbox.Event("workflow.started", SUBJECT, subject_of(name, run_id), {"name": name, "id": run_id})
    events: list[JsonData] = [{"wf": "start", "args": args}]

    async def create(tx: Transaction) -> MachineRow:
        now = tx.store.now_ms()
        return await driven.create(tx, name, run_id, events, aux, now, (new_token(), now + lease_ms), announce=[started])

    if ctx.store.dialect.one_statement_writes:
        # PostgreSQL: the machine, its start record, its events and this server's lease in one statement — a
        # start is one round trip (shared with the starts arriving at the same moment).
        now = ctx.store.now_ms()
        new = driven.NewMachine(name, run_id, aux, now, (new_token(), now + lease_ms), events, now,
                                announce=[(started.type, started.subject_kind, started.subject_id, started.data)])
        created = await driven.create_at_once(ctx.store, new)
        if created is None:
            return await _existing(ctx, name, run_id), False
        machine = created
    else:
        try:
            machine = await ctx.store.grouped(create)
        except Exception as exc:
            if not ctx.store.dialect.is_unique_violation(exc):
                raise
            return await _existing(ctx, name, run_id), False
    runner_of(ctx).launch(machine, args)
    return machine, True


async def _existing(ctx: Context, name: str, run_id: str) -> MachineRow:
    existing = await driven.machine(ctx.store, name, run_id)
    if existing is None:
        raise RunNotFound(f"no run {run_id!r} of workflow {name!r}")  # removed between the start and this read
    return existing


# --- read and list --------------------------------------------------------------------------------------------------


async def get_run(ctx: Context, name: str, run_id: str, wait_ms: int = 0) -> RunView:
    """The run with its steps; with ``wait_ms``, once it finishes or the wait ends."""
    deadline = time.monotonic() + ctx.wait_s(wait_ms)
    while True:
        waiter = ctx.store.notifier.waiter(FINISHED)
        machine = await driven.machine(ctx.store, name, run_id)
        if machine is None:
            _known(ctx, name)
            raise RunNotFound(f"no run {run_id!r} of workflow {name!r}")
        left = deadline - time.monotonic()
        if _status(machine) in FINISHED_STATUSES or left <= 0:
            history = await driven.history(ctx.store, machine)
            start = history[0].data if history and isinstance(history[0].data, dict) else {}
            return run_to_api(machine, start.get("args"), history)
        # Wake-ups are hints: look again at least every second.
        await waiter.wait(min(left, 1.0))


async def list_runs(ctx: Context, name: str, status: str | None, limit: int, cursor: str | None) -> tuple[list[RunView], str | None]:
    _known(ctx, name)
    after = None
    if cursor:
        after = machine_id_cursor(cursor)
    async with ctx.store.read() as conn:
        # A failed run's machine is failed whatever its aux state said last; its aux state says failed too.
        found = await machines_data.list_by_aux(conn, name, "status", status, after, limit + 1)
        args = await machines_data.first_events(conn, [m.uid for m in found[:limit]])
    next_cursor = encode_cursor(found[limit - 1].id) if len(found) > limit else None
    runs = []
    for machine in found[:limit]:
        start = args.get(machine.uid)
        runs.append(run_to_api(machine, start.get("args") if isinstance(start, dict) else None, None))
    return runs, next_cursor


class WorkflowSummary(TypedDict):
    """A registered workflow with its runs counted by status."""

    name: str
    counts: dict[str, int]


async def workflow_summaries(ctx: Context) -> list[WorkflowSummary]:
    """Every workflow registered on this server, with its runs counted by status."""
    summaries: list[WorkflowSummary] = []
    async with ctx.store.read() as conn:
        for name in workflow_names(ctx):
            counted = await machines_data.count_by_aux(conn, name, "status")
            summaries.append({"name": name, "counts": {status: int(counted.get(status, 0)) for status in STATUSES}})
    return summaries


# --- signal, cancel, retry ------------------------------------------------------------------------------------------


async def _locked_run(tx: Transaction, ctx: Context, name: str, run_id: str) -> MachineRow:
    machine = await driven.lock(tx, name, run_id)
    if machine is None:
        _known(ctx, name)
        raise RunNotFound(f"no run {run_id!r} of workflow {name!r}")
    return machine


async def signal_run(ctx: Context, name: str, run_id: str, signal: str, payload: JsonData) -> None:
    """Queue a signal for the run; kept, in order, until a wait takes it."""
    async with ctx.store.transaction() as tx:
        machine = await _locked_run(tx, ctx, name, run_id)
        if _status(machine) in FINISHED_STATUSES:
            raise RunFinished(f"run {run_id!r} is {_status(machine)}")
        await driven.notify_in(tx, machine, {"signal": signal, "payload": payload})
        tx.notify(INPUTS)


async def cancel_run(ctx: Context, name: str, run_id: str) -> RunView:
    """Cancel the run: ``cancelled`` at once; its code gets ``CancelledError`` at its current await."""
    async with ctx.store.transaction() as tx:
        machine = await _locked_run(tx, ctx, name, run_id)
        status = _status(machine)
        if status in FINISHED_STATUSES:
            raise RunFinished(f"run {run_id!r} is {status}")
        aux: RunAux = {**records.aux_of(machine), "status": "cancelled", "waiting_for": None, "finished_at": tx.store.now_ms()}
        await driven.append(tx, machine, [{"wf": "cancel"}], records.as_json(aux), timer_at=tx.store.now_ms())
        await outbox.emit(tx, "workflow.cancelled", SUBJECT, machine.subject, {"name": name, "id": run_id, "status": "cancelled"})
        tx.notify(INPUTS)
        tx.notify(FINISHED)
    return await get_run(ctx, name, run_id)


async def retry_run(ctx: Context, name: str, run_id: str) -> RunView:
    """Resume a failed run from its records (recorded steps are not called again)."""
    async with ctx.store.transaction() as tx:
        machine = await _locked_run(tx, ctx, name, run_id)
        if _status(machine) != "failed":
            raise RunNotFailed(f"run {run_id!r} is {_status(machine)}")
        aux: RunAux = {**records.aux_of(machine), "status": "running", "waiting_for": None, "error": None, "finished_at": None, "ended": False}
        await driven.append(tx, machine, [{"wf": "retry"}], records.as_json(aux), timer_at=tx.store.now_ms(), status="working")
    return await get_run(ctx, name, run_id)


async def tell_watcher(ctx: Context, watcher: list[JsonData], outcome: Mapping[str, JsonData]) -> None:
    """Tell a parent run (``[name, id, n]``) that its child ended."""
    name, run_id, n = cast(tuple[str, str, int], watcher)  # as _start stores it: [name, id, n]
    error = cast(JsonObject | None, outcome.get("error"))
    async with ctx.store.transaction() as tx:
        parent = await driven.lock(tx, name, run_id)
        if parent is None:
            return
        await driven.notify_in(tx, parent, {"child": n, "status": outcome.get("status"), "result": outcome.get("result"),
                                            "error": None if error is None else {"type": error.get("type"), "message": error.get("message")}})
        tx.notify(INPUTS)


# --- a task's end wakes its run ----------------------------------------------------------------------------------------


async def tasks_finished(tx: Transaction, finished: list[finishes.Finished]) -> None:
    """``core.finishes`` watcher of ``wf:`` items: a notification for each one's run, in the finishing transaction.
    Runs are locked in one order (by name and id, then by uid), the last locks the transaction takes."""
    wanted: list[tuple[tuple[bool, str, str], finishes.Finished, tuple[str, str | int, int]]] = []
    for item in finished:
        parsed = records.parse_message_id(item.message_id)
        if parsed is not None:
            wanted.append(((isinstance(parsed[1], int), parsed[0], str(parsed[1])), item, parsed))
    for _order, item, (name, run, n) in sorted(wanted, key=lambda w: w[0]):
        if isinstance(run, int):
            found = await machines_data.machines_by_uid(tx, [run])
            machine = await driven.lock(tx, found[0].namespace, found[0].id) if found else None
        else:
            machine = await driven.lock(tx, name, run)
        if machine is None:
            continue
        await driven.notify_in(tx, machine, {"task": n, "status": item.state, "result": item.result, "error": item.error})
        tx.notify(INPUTS)


finishes.watch("wf:", tasks_finished)


async def drive(ctx: Context, machine: MachineRow) -> None:
    await runner_of(ctx).drive(machine)


def subject_of(name: str, run_id: str) -> str:
    return machine_subject(name, run_id)

