"""The package cafe: packages wait here until exactly one worker claims them under a lease.

A claim takes the oldest ready package (or one whose lease expired) with ``SKIP LOCKED``, so concurrent
claimers on any number of servers never get the same package. Every finishing write is fenced by the
lease token: a worker whose lease was taken over gets ``409 lease_lost`` and changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from typing import TypedDict

from mainspring.batching import data, metrics
from mainspring.batching.data import PackageLease, PackageRow, TaskRow
from mainspring.batching.errors import PackageNotFound, UnknownTaskResult
from mainspring.batching.models import DEFAULTS, TaskResult
from mainspring.batching.service import cafe_channel, task_subject
from mainspring.core import outbox
from mainspring.core.errors import LeaseLost, MainspringError
from mainspring.core.leases import new_token
from mainspring.core.paging import encode_cursor, int_cursor
from mainspring.store import Store, Transaction, format_time
from mainspring.store.notify import PG_CHANNEL
from mainspring.types import JsonData, JsonObject


class LeaseView(TypedDict):
    token: str
    expires_at: str | None


class PackageTaskView(TypedDict):
    id: str
    group: str
    member: str
    version: int | None
    sha256: str
    content: JsonData
    data: JsonData
    status: str
    reissued: bool


class PackageView(TypedDict):
    """A package as the API shows it, with its tasks."""

    id: str
    batcher: str
    status: str
    size: int
    worker: str | None
    attempts: int
    error: str | None
    lease: LeaseView | None
    tasks: list[PackageTaskView]
    created_at: str | None
    updated_at: str | None


def package_to_api(row: PackageRow, tasks: list[TaskRow], *, with_lease: bool = True) -> PackageView:
    lease: LeaseView | None = None
    if with_lease and row.status == "claimed" and row.lease_token:
        lease = {"token": row.lease_token, "expires_at": format_time(row.lease_expires_at)}
    return {
        "id": row.id,
        "batcher": row.batcher,
        "status": row.status,
        "size": row.size,
        "worker": row.worker,
        "attempts": row.attempts,
        "error": row.error,
        "lease": lease,
        "tasks": [
            {
                "id": t.id,
                "group": t.group,
                "member": t.member,
                "version": t.version,
                "sha256": t.sha256,
                "content": t.content,
                "data": t.data,
                "status": t.status,
                "reissued": t.reissued,
            }
            for t in tasks
        ],
        "created_at": format_time(row.created_at),
        "updated_at": format_time(row.updated_at),
    }


def count_claim(batcher: str, retaken_after_expiry: bool) -> None:
    metrics.CLAIMS.labels(batcher).inc()
    if retaken_after_expiry:  # the lease ran out before the dispatcher put the package back: still an expiry
        metrics.LEASE_EXPIRIES.labels(batcher).inc()


async def claim_once(store: Store, name: str, worker: str, lease_ms: int | None) -> PackageView | None:
    """Claim the oldest waiting package of ``name`` for ``worker``, or None."""
    # Claims of one batcher arriving together share one commit and one statement (PostgreSQL: alone in its
    # transaction, also their events and the event readers' wake-up): every claim writes an event, and events
    # commit one transaction at a time (their numbering lock), so a commit per claim would bound the claims.
    return await store.grouped_batch(("batching.claim", name), functools.partial(_claim_all, name),
                                     data.Claimer(worker, new_token(), lease_ms))


async def _claim_all(name: str, tx: Transaction, claimers: list[data.Claimer]) -> list[PackageView | None]:
    now = tx.store.now_ms()
    claimed, wrote_events = await data.claim_oldest_many(
        tx, name, claimers, DEFAULTS["lease_ms"], now, (PG_CHANNEL, outbox.SEQUENCER_CHANNEL)
    )
    taken = [c for c in claimed if c is not None]
    if not taken:
        return [None] * len(claimers)
    if wrote_events:
        tx.notify(outbox.SEQUENCER_CHANNEL)
    else:
        await outbox.emit_many(tx, [
            outbox.Event("batch.package.claimed", "batch_package", c.package.id,
                         {"batcher": name, "worker": c.package.worker, "attempt": c.package.attempts,
                          "retaken_after_expiry": c.retaken})
            for c in taken
        ])
    for c in taken:
        tx.after_commit(functools.partial(count_claim, name, c.retaken))
    return [None if c is None else package_to_api(c.package, c.tasks) for c in claimed]


async def claim(
    store: Store, name: str, worker: str, lease_ms: int | None, wait_ms: int, poll_ms: int
) -> PackageView | None:
    """Claim a package, waiting up to ``wait_ms`` (real time) for one to be made."""
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        # Taken before looking, so a package made between the look and the wait still wakes us.
        waiter = store.notifier.waiter(cafe_channel(name))
        package = await claim_once(store, name, worker, lease_ms)
        if package is not None:
            return package
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        await waiter.wait(min(remaining, poll_ms / 1000))
        await asyncio.sleep(0)


async def _locked_package(tx: Transaction, package_id: str) -> PackageRow:
    row = await data.lock_package(tx, package_id)
    if row is None:
        raise PackageNotFound(f"no package {package_id!r}")
    return row


def _normalize_results(results: object, task_ids: list[str]) -> dict[str, TaskResult]:
    if results is None:
        outcomes: dict[str, TaskResult] = {}
    elif not isinstance(results, dict | list):
        raise UnknownTaskResult(
            "results must be a list of task outcomes or a map of task id to result",
            errors=[{"loc": ["body", "results"], "msg": f"got {type(results).__name__}"}],
        )
    elif isinstance(results, dict):
        outcomes = {tid: TaskResult(task_id=tid, result=value) for tid, value in results.items()}
    else:
        outcomes = {}
        for item in results:
            item = item if isinstance(item, TaskResult) else TaskResult.model_validate(item)
            outcomes[item.task_id] = item
    unknown = sorted(set(outcomes) - set(task_ids))
    if unknown:
        raise UnknownTaskResult(
            "results name tasks that are not in this package",
            errors=[{"loc": ["body", "results", tid], "msg": "not a task of this package"} for tid in unknown],
        )
    return outcomes


@dataclasses.dataclass(frozen=True, slots=True)
class _Completion:
    package_id: str
    token: str
    results: object
    """As the client sent them: checked by ``_normalize_results``."""


async def complete_package(
    store: Store, package_id: str, token: str, results: object
) -> PackageView:
    """Finish a claimed package with per-task outcomes (a task left out is done)."""
    # Completions arriving together share one commit and its statements (the packages locked with their tasks,
    # their outcomes, their events); a refused one (lease lost, unknown task) writes nothing and gets its own
    # answer while the others commit.
    return await store.grouped_batch("batching.complete", _complete_all, _Completion(package_id, token, results))


async def _complete_all(tx: Transaction, completions: list[_Completion]) -> list[PackageView | MainspringError | ValueError]:
    """Each completion's answer, or the error refusing it (raised to that caller alone)."""
    locked = await data.lock_packages_with_tasks(tx, [c.package_id for c in completions])
    now = tx.store.now_ms()
    answers: list[PackageView | MainspringError | ValueError] = []
    package_seqs: list[int] = []
    outcome_rows: list[data.TaskOutcome] = []
    events: list[outbox.Event] = []
    for completion in completions:
        try:
            row, tasks, finishes = _finish(completion, locked.get(completion.package_id), now)
        except (MainspringError, ValueError) as refused:
            answers.append(refused)
            continue
        if finishes:
            package_seqs.append(row.seq)
            outcome_rows.extend(data.TaskOutcome(t.seq, t.status, t.result, t.error) for t in tasks)
            events.extend(_completion_events(row, tasks))
            locked[completion.package_id] = (row, tasks)  # a repeat later in this group answers what was written
        answers.append(package_to_api(row, tasks, with_lease=False))
    if package_seqs:
        # The tasks' outcomes and the packages in as few statements as the engine allows (one on PostgreSQL);
        # the answers are what was written, not read back. The events go through the outbox, written as the
        # shared transaction's last statement: inserted here, their numbering lock would be held while the
        # group's later writes wait for rows other transactions hold.
        # This is the transaction's last statement: alone in it (no other kind of write in the group), on PostgreSQL
        # it writes the events as well.
        if await data.complete_packages(tx, package_seqs, outcome_rows, now, events):
            tx.notify(outbox.EVENTS_CHANNEL)
        else:
            await outbox.emit_many(tx, events)
    return answers


def _finish(
    completion: _Completion, found: tuple[PackageRow, list[TaskRow]] | None, now: int
) -> tuple[PackageRow, list[TaskRow], bool]:
    """The package and its tasks once ``completion`` is applied, and whether it finishes the package now
    (False: a repeat of the completion that finished it); or the error that refuses it."""
    if found is None:
        raise PackageNotFound(f"no package {completion.package_id!r}")
    row, tasks = found
    if row.status == "done" and row.lease_token == completion.token:
        return row, tasks, False  # a repeat of the same completion
    if row.status != "claimed" or row.lease_token != completion.token:
        raise LeaseLost(f"package {completion.package_id} is not held with this token")
    outcomes = _normalize_results(completion.results, [t.id for t in tasks])
    finished: list[TaskRow] = []
    for task in tasks:
        outcome = outcomes.get(task.id) or TaskResult(task_id=task.id)
        status = outcome.status
        error = outcome.error if status == "failed" else None
        if status == "failed" and error is None:
            error = "failed by the worker"
        finished.append(dataclasses.replace(task, status=status, result=outcome.result, error=error, updated_at=now))
    return dataclasses.replace(row, status="done", lease_expires_at=None, error=None, updated_at=now), finished, True


def _completion_events(row: PackageRow, tasks: list[TaskRow]) -> list[outbox.Event]:
    events: list[outbox.Event] = []
    for task in tasks:
        told: JsonObject = {"batcher": row.batcher, "id": task.id, "package_id": row.id}
        if task.status == "failed":
            told["error"] = task.error
        events.append(outbox.Event(f"batch.task.{task.status}", "batch_task", task_subject(row.batcher, task.id), told))
    events.append(outbox.Event("batch.package.done", "batch_package", row.id,
                               {"batcher": row.batcher, "worker": row.worker, "size": row.size}))
    return events


async def fail_package(
    store: Store, package_id: str, token: str, error: str, retry: bool
) -> PackageView:
    """Give a claimed package up: back to the cafe (``retry``) or failed for good with its tasks."""
    async with store.transaction() as tx:
        row = await _locked_package(tx, package_id)
        if row.status == "failed" and row.lease_token == token and not retry:
            return package_to_api(row, await data.package_tasks(tx, package_id), with_lease=False)
        if row.status != "claimed" or row.lease_token != token:
            raise LeaseLost(f"package {package_id} is not held with this token")
        now = store.now_ms()
        events: list[outbox.Event] = []
        if retry:
            await data.put_package_back(tx, row.seq, error, now)
            await data.set_package_tasks_status(tx, package_id, "packed", now)
            tx.notify(cafe_channel(row.batcher))
        else:
            await data.finish_package(tx, row.seq, "failed", error, now)
            tasks = await data.package_tasks(tx, package_id)
            await data.set_package_tasks_status(tx, package_id, "failed", now, error=error)
            events.extend(
                outbox.Event("batch.task.failed", "batch_task", task_subject(row.batcher, t.id),
                             {"batcher": row.batcher, "id": t.id, "package_id": package_id, "error": error})
                for t in tasks
            )
        events.append(
            outbox.Event("batch.package.failed", "batch_package", package_id,
                         {"batcher": row.batcher, "worker": row.worker, "error": error, "retry": retry})
        )
        await outbox.emit_many(tx, events)
        return package_to_api(await data.package_by_seq(tx, row.seq), await data.package_tasks(tx, package_id), with_lease=False)


async def heartbeat_package(
    store: Store, package_id: str, token: str, lease_ms: int | None
) -> PackageView:
    """Extend a held lease."""
    async with store.transaction() as tx:
        row = await _locked_package(tx, package_id)
        if row.status != "claimed" or row.lease_token != token:
            raise LeaseLost(f"package {package_id} is not held with this token")
        now = store.now_ms()
        span = lease_ms or row.lease_ms or DEFAULTS["lease_ms"]
        await data.extend_lease(tx, row.seq, span, now)
        return package_to_api(await data.package_by_seq(tx, row.seq), await data.package_tasks(tx, package_id))


async def expire_leases(tx: Transaction, name: str, now: int) -> None:
    """Put packages whose lease ran out back in the cafe (their tasks back to ``packed``)."""
    rows = await data.lock_expired_leases(tx, name, now)
    for row in rows:
        await data.put_package_back(tx, row.seq, "lease expired", now)
        await data.set_package_tasks_status(tx, row.id, "packed", now)
        await outbox.emit(
            tx, "batch.package.failed", "batch_package", row.id,
            {"batcher": name, "worker": row.worker, "error": "lease expired", "retry": True, "lease_expired": True},
        )
    if rows:
        tx.notify(cafe_channel(name))
        tx.after_commit(lambda: metrics.LEASE_EXPIRIES.labels(name).inc(len(rows)))


async def package_batcher(store: Store, package_id: str) -> str | None:
    """The batcher a package belongs to (whose scope it is in), or None for an unknown id."""
    async with store.read() as conn:
        row = await data.get_package(conn, package_id)
    return None if row is None else row.batcher


async def get_package(store: Store, package_id: str) -> PackageView:
    async with store.read() as conn:
        row = await data.get_package(conn, package_id)
        if row is None:
            raise PackageNotFound(f"no package {package_id!r}")
        # The token is the claimer's secret: reading a package never shows it.
        return package_to_api(row, await data.package_tasks(conn, package_id), with_lease=False)


async def list_packages(
    store: Store, name: str, status: str | None, limit: int, cursor: str | None, tasks_per_package: int | None = None
) -> tuple[list[PackageView], str | None]:
    """A page of packages with their tasks (the first ``tasks_per_package`` of each, or all: a package's
    ``size`` says how many it has)."""
    after = int_cursor(cursor) if cursor else 0
    async with store.read() as conn:
        rows = await data.list_packages(conn, name, status, after, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        tasks = await data.tasks_of_packages(conn, [r.id for r in rows], tasks_per_package)
        items = [package_to_api(r, tasks[r.id], with_lease=False) for r in rows]
    return items, encode_cursor(rows[-1].seq) if more else None


async def package_leases(store: Store, name: str) -> list[PackageLease]:
    """Who holds each claimed package of ``name`` and until when (never the token)."""
    async with store.read() as conn:
        return await data.package_leases(conn, name)
