"""Batchers, task submission with content versions, task status and the version log (API.md §4).

The dispatcher (batch forming) is in ``dispatcher.py``; the package cafe (claim, heartbeat, finish) in
``cafe.py``. All three write only through ``store.transaction()`` and emit their events in it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from mainspring.batching import data
from mainspring.batching.data import BatcherRow, NewTask, VersionRow
from mainspring.batching.errors import (
    BatcherBusy,
    BatcherNotFound,
    BatcherSettingsConflict,
    InvalidBatcherSettings,
    TaskIdConflict,
    TaskNotFound,
)
from mainspring.batching.models import DEFAULTS, SETTING_KEYS, BatcherSettingsIn, TaskIn
from mainspring.batching.planner import PendingTask
from mainspring.core import outbox
from mainspring.core.errors import MainspringError
from mainspring.core.paging import encode_cursor, int_cursor
from mainspring.store import Store, Transaction, format_time
from mainspring.store.notify import Waiter
from mainspring.types import JsonData, JsonInput, JsonObject

TASK_STATUSES = ("pending", "packed", "claimed", "done", "failed", "rejected")
PACKAGE_STATUSES = ("ready", "claimed", "done", "failed")


def dispatcher_channel(name: str) -> str:
    """Wakes the dispatcher loops (they wait on the ``batching`` prefix)."""
    return f"batching:{name}"


def cafe_channel(name: str) -> str:
    """Wakes claimers waiting for a package of ``name``; kept apart so submits do not wake them."""
    return f"batching-cafe:{name}"


def task_subject(batcher: str, task_id: str) -> str:
    return f"{batcher}/{task_id}"


def group_lock_key(batcher: str, group: str) -> str:
    """Serializes the numbering of one group's versions (submits, and the dispatcher's reissues)."""
    return f"batching:{batcher}:{group}"


def content_sha256(content: JsonData) -> str:
    """A string is hashed as its UTF-8 bytes (a book's plain text); any other JSON as canonical JSON."""
    if isinstance(content, str):
        raw = content.encode()
    else:
        raw = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.sha256(raw).hexdigest()


# --- batchers -------------------------------------------------------------------------------------------


MAX_VERSION = 2**31 - 1


def check_rules(values: Mapping[str, Any], refusal: type[MainspringError] = InvalidBatcherSettings) -> None:
    errors: list[JsonInput] = []
    if values["min_size"] > values["max_size"]:
        errors.append({"loc": ["body", "min_size"], "msg": "min_size must not exceed max_size"})
    if values["group_size"] > values["max_size"]:
        errors.append({"loc": ["body", "group_size"], "msg": "group_size must not exceed max_size"})
    if errors:
        raise refusal("inconsistent batcher settings", errors=errors)


def batcher_to_api(row: BatcherRow, counts: dict[str, int] | None = None, package_counts: dict[str, int] | None = None) -> JsonObject:
    out: JsonObject = {"name": row.name, **{k: getattr(row, k) for k in SETTING_KEYS}}
    out["linger_started_at"] = format_time(row.linger_started_at)
    out["linger_ends_at"] = format_time(row.linger_ends_at)
    out["created_at"] = format_time(row.created_at)
    out["updated_at"] = format_time(row.updated_at)
    if counts is not None:
        out["counts"] = {s: counts.get(s, 0) for s in TASK_STATUSES}
    if package_counts is not None:
        out["package_counts"] = {s: package_counts.get(s, 0) for s in PACKAGE_STATUSES}
    return out


BATCHERS_REMOVED_CHANNEL = "batchers-removed"
"""Signalled when a batcher is deleted, on every server (NOTIFY): their caches of known batchers start over."""


@dataclass
class _KnownBatchers:
    names: set[str]
    removed: Waiter
    """Taken before any name went into ``names``: once signalled, a batcher may have gone, so all are forgotten."""


# Once a server has seen a batcher it need not look again on every submit, until one is deleted anywhere.
_known_batchers: weakref.WeakKeyDictionary[Store, _KnownBatchers] = weakref.WeakKeyDictionary()


def known_batchers(store: Store) -> set[str]:
    """The batchers this server knows exist; a fresh (empty) set after any batcher was deleted."""
    entry = _known_batchers.get(store)
    if entry is None or entry.removed.signalled:
        entry = _known_batchers[store] = _KnownBatchers(set(), store.notifier.waiter(BATCHERS_REMOVED_CHANNEL))
    return entry.names


async def ensure_batcher(tx: Transaction, name: str, defaults: Mapping[str, object] | None = None) -> None:
    """Create the batcher with ``defaults`` (else the API defaults) on first use."""
    known = known_batchers(tx.store)
    if name in known:
        return
    if await data.batcher_exists(tx, name):
        tx.after_commit(lambda: known.add(name))
        return
    values = {**DEFAULTS, **{k: v for k, v in (defaults or {}).items() if k in SETTING_KEYS}}
    check_rules(values)
    await data.insert_batcher_if_missing(tx, name, values, tx.store.now_ms())
    tx.after_commit(lambda: known.add(name))


async def put_batcher(store: Store, name: str, body: BatcherSettingsIn) -> JsonObject:
    """Create or change a batcher's stored settings; every server's dispatcher uses them from its next round."""
    changes = body.model_dump(exclude_none=True)
    async with store.transaction() as tx:
        await ensure_batcher(tx, name)
        row = await data.lock_batcher(tx, name)
        if row is None:  # deleted by another server between the two statements
            raise BatcherNotFound(f"no batcher {name!r}")
        values = {**{k: getattr(row, k) for k in SETTING_KEYS}, **changes}
        check_rules(values, BatcherSettingsConflict)
        await data.update_batcher_settings(tx, name, values, store.now_ms())
        tx.notify(dispatcher_channel(name))
    return await get_batcher(store, name)


async def delete_batcher(store: Store, name: str, force: bool = False) -> None:
    """Delete a batcher with its tasks, packages and version log in one transaction (event
    ``batch.batcher.removed``). Refused (``BatcherBusy``) while one of its packages is claimed under a lease
    that has not expired, unless ``force``: that worker's complete/fail then answers ``package_not_found``.
    A later submit (or a server's ``@app.batcher`` registration) creates it afresh, versions from 1."""
    async with store.transaction() as tx:
        if await data.lock_batcher(tx, name) is None:
            raise BatcherNotFound(f"no batcher {name!r}")
        if not force:
            held = await data.held_packages(tx, name, store.now_ms())
            if held:
                raise BatcherBusy(
                    f"{held} package(s) of batcher {name!r} are claimed and their leases have not expired;"
                    " wait, or delete with force=true",
                    batcher=name, claimed=held,
                )
        removed = await data.delete_batcher_rows(tx, name)
        await outbox.emit(
            tx, "batch.batcher.removed", "batcher", name,
            {"batcher": name, "forced": force, "tasks": removed.tasks, "packages": removed.packages,
             "versions": removed.versions},
        )
        tx.notify(BATCHERS_REMOVED_CHANNEL)
        # Claimers waiting for a package of it look again (and find none).
        tx.notify(cafe_channel(name))


async def get_batcher(store: Store, name: str) -> JsonObject:
    async with store.read() as conn:
        row = await data.get_batcher(conn, name)
        if row is None:
            raise BatcherNotFound(f"no batcher {name!r}")
        counts = await data.count_batcher_tasks(conn, name)
        package_counts = await data.count_batcher_packages(conn, name)
    return batcher_to_api(row, counts, package_counts)


async def batcher_names(store: Store) -> list[str]:
    """Every batcher's name, in order."""
    async with store.read() as conn:
        return await data.batcher_names(conn)


# --- tasks ----------------------------------------------------------------------------------------------


class TaskView(TypedDict):
    """A task as the API shows it."""

    id: str
    batcher: str
    group: str
    member: str
    sha256: str
    version: int | None
    status: str
    reason: str | None
    package_id: str | None
    reissued: bool
    data: JsonData
    result: JsonData
    error: str | None
    created_at: str | None
    updated_at: str | None


class VersionView(TypedDict):
    """One line of a member's version log."""

    version: int
    sha256: str
    task_id: str
    at: str | None
    withdrawn_at: str | None


def task_to_api(row: NewTask) -> TaskView:
    return {
        "id": row.id,
        "batcher": row.batcher,
        "group": row.group,
        "member": row.member,
        "sha256": row.sha256,
        "version": row.version,
        "status": row.status,
        "reason": row.reason,
        "package_id": row.package_id,
        "reissued": row.reissued,
        "data": row.data,
        "result": row.result,
        "error": row.error,
        "created_at": format_time(row.created_at),
        "updated_at": format_time(row.updated_at),
    }


def registration_defaults(registry: object, name: str) -> dict[str, object] | None:
    """The settings a batcher registered in code (``@app.batcher``) starts with, if it is one."""
    registered = getattr(registry, "batchers", {}).get(name)
    return dict(registered.options) if registered is not None else None


async def submit_task(store: Store, name: str, body: TaskIn, defaults: Mapping[str, object] | None = None) -> tuple[TaskView, bool]:
    """Accept a task. Answers (task, accepted_now): accepted_now is False for a repeat of a known id and
    for a duplicate content (status ``rejected``, reason ``duplicate``)."""
    sha = content_sha256(body.content)
    for attempt in range(3):
        try:
            return await _submit_once(store, name, body, sha, defaults)
        except Exception as exc:
            # Two submits of one id (or two servers creating one batcher) raced; the retry reads the winner.
            if not store.dialect.is_unique_violation(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")


async def _submit_once(
    store: Store, name: str, body: TaskIn, sha: str, defaults: Mapping[str, object] | None
) -> tuple[TaskView, bool]:
    # Submits arriving together share one commit (a refused one is replayed alone).
    async def work(tx: Transaction) -> tuple[TaskView, bool]:
        await ensure_batcher(tx, name, defaults)
        # One group's versions are numbered one submit at a time, on every server. Sharing a commit, a submit
        # does not wait for a group another transaction numbers: the group is run again one submit at a time.
        key = group_lock_key(name, body.group)
        if not tx.shared:
            await store.dialect.advisory_xact_lock(tx, key)
        elif not await store.dialect.try_advisory_xact_lock(tx, key):
            raise GroupBusy(f"group {body.group!r} is being numbered by another transaction")
        known = await data.get_task(tx, name, body.id)
        if known is not None:
            if (known.sha256, known.group, known.member) != (sha, body.group, body.member):
                raise TaskIdConflict(
                    f"task {body.id!r} is already stored with other content, group or member", task_id=body.id
                )
            return task_to_api(known), False
        now = store.now_ms()
        # One look at the group's log: the version this content already has, this member's latest, the group's.
        found = await data.content_in_log(tx, name, body.group, body.member, sha)
        if found.same is not None:
            task = _new_task(name, body, sha, now, "rejected", "duplicate", found.same)
            await data.insert_task(tx, task)
            await outbox.emit(
                tx, "batch.task.rejected", "batch_task", task_subject(name, body.id),
                {"batcher": name, "id": body.id, "group": body.group, "member": body.member,
                 "reason": "duplicate", "version": found.same, "sha256": sha},
            )
            return task_to_api(task), False
        version = max((found.own_latest or 0) + 1, found.group_latest or 0)
        await data.insert_version_line(tx, name, body.group, body.member, version, sha, body.id, now)
        task = _new_task(name, body, sha, now, "pending", None, version)
        await data.insert_task(tx, task)
        await outbox.emit(
            tx, "batch.task.accepted", "batch_task", task_subject(name, body.id),
            {"batcher": name, "id": body.id, "group": body.group, "member": body.member, "version": version, "sha256": sha},
        )
        tx.notify(dispatcher_channel(name))
        return task_to_api(task), True

    if store.dialect.one_statement_writes:
        # Submits arriving together: their groups' locks in one statement, then one statement for all of them.
        return await store.grouped_batch("batching.submit", _submit_all, _Submit(name, body, sha, defaults))
    return await store.grouped(work)


@dataclass(frozen=True, slots=True)
class _Submit:
    name: str
    body: TaskIn
    sha: str
    defaults: Mapping[str, object] | None


async def _submit_all(tx: Transaction, submits: list[_Submit]) -> list[tuple[TaskView, bool] | Exception]:
    """PostgreSQL: the submits of one group commit. Each group's versions are numbered under its lock, taken
    first (sharing a commit, a submit does not wait for a group another transaction numbers: the group commit
    is then run one submit at a time); the submits then go in one statement per round, each round holding at
    most one submit per group and per task id (a later one must see what the earlier one wrote)."""
    for name in sorted({s.name for s in submits}):
        await ensure_batcher(tx, name, next(s.defaults for s in submits if s.name == name))
    keys = {group_lock_key(s.name, s.body.group) for s in submits}
    if not await data.lock_groups(tx, keys, wait=not tx.shared):
        raise GroupBusy("a group is being numbered by another transaction")
    answers: list[tuple[TaskView, bool] | Exception | None] = [None] * len(submits)
    pending = list(range(len(submits)))
    now = tx.store.now_ms()
    wake: set[str] = set()
    while pending:
        this_round: list[int] = []
        later: list[int] = []
        seen: set[tuple[str, str]] = set()
        for i in pending:
            s = submits[i]
            keys_of = {("g", f"{s.name}\x00{s.body.group}"), ("t", f"{s.name}\x00{s.body.id}")}
            if keys_of & seen:
                later.append(i)
            else:
                seen |= keys_of
                this_round.append(i)
        tasks = [_new_task(submits[i].name, submits[i].body, submits[i].sha, now, "pending", None, 0) for i in this_round]
        outcomes = await data.submit_new_tasks(tx, tasks, now)
        for i, task, outcome in zip(this_round, tasks, outcomes, strict=True):
            s = submits[i]
            if outcome.known is not None:
                known = await data.task_by_seq(tx, outcome.known)
                if (known.sha256, known.group, known.member) != (s.sha, s.body.group, s.body.member):
                    answers[i] = TaskIdConflict(
                        f"task {s.body.id!r} is already stored with other content, group or member", task_id=s.body.id
                    )
                else:
                    answers[i] = (task_to_api(known), False)
                continue
            assert outcome.version is not None
            wake.add(outbox.SEQUENCER_CHANNEL)  # its event was written
            if outcome.accepted:
                answers[i] = (task_to_api(dataclasses.replace(task, version=outcome.version)), True)
                wake.add(dispatcher_channel(s.name))
            else:
                answers[i] = (task_to_api(dataclasses.replace(task, version=outcome.version, status="rejected",
                                                              reason="duplicate")), False)
        pending = later
    for channel in sorted(wake):
        tx.notify(channel)
    assert all(a is not None for a in answers)
    return answers  # type: ignore[return-value]


class GroupBusy(Exception):
    """A submit sharing a commit found its group locked (the shared commit is then run one submit at a time)."""


def _new_task(name: str, body: TaskIn, sha: str, now: int, status: str, reason: str | None, version: int) -> NewTask:
    return NewTask(
        batcher=name, id=body.id, group=body.group, member=body.member, sha256=sha, version=version, status=status,
        reason=reason, package_id=None, content=body.content, data=body.data, result=None, error=None,
        created_at=now, updated_at=now, reissued=False,
    )


async def get_task(store: Store, name: str, task_id: str) -> TaskView:
    async with store.read() as conn:
        row = await data.get_task(conn, name, task_id)
    if row is None:
        raise TaskNotFound(f"no task {task_id!r} in batcher {name!r}")
    return task_to_api(row)


# --- the version log ------------------------------------------------------------------------------------


def version_to_api(row: VersionRow) -> VersionView:
    return {
        "version": row.version,
        "sha256": row.sha256,
        "task_id": row.task_id,
        "at": format_time(row.at),
        "withdrawn_at": format_time(row.withdrawn_at),
    }


async def list_versions(
    store: Store, name: str, group: str, member: str, limit: int, cursor: str | None
) -> tuple[list[VersionView], str | None]:
    """The permanent log of one group+member, oldest version first."""
    # Versions are 32-bit integers in the store: any cursor past the largest is after every version (PostgreSQL
    # refuses a larger parameter for the column).
    after = min(int_cursor(cursor), MAX_VERSION) if cursor else 0
    async with store.read() as conn:
        rows = await data.member_versions(conn, name, group, member, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return [version_to_api(r) for r in rows], encode_cursor(rows[-1].version) if more else None


async def group_versions(store: Store, name: str, group: str) -> dict[str, list[VersionView]]:
    """Every member's permanent log of one group (both books of a pair) in one read; a group nothing was
    submitted to answers no members. An unknown batcher is ``BatcherNotFound``."""
    async with store.read() as conn:
        rows = await data.group_versions(conn, name, group)
        if not rows and not await data.batcher_exists(conn, name):
            raise BatcherNotFound(f"no batcher {name!r}")
    members: dict[str, list[VersionView]] = {}
    for row in rows:
        members.setdefault(row.member, []).append(version_to_api(row))
    return members


async def group_log(store: Store, name: str, group: str) -> list[VersionRow]:
    """Every line of one group's version log (withdrawn ones too), by version then member."""
    async with store.read() as conn:
        rows = await data.group_versions(conn, name, group)
    return sorted(rows, key=lambda row: (row.version, row.member))


async def forming_batch(store: Store, name: str, limit: int) -> list[PendingTask]:
    """The batch being formed: the batcher's pending tasks, oldest first, at most ``limit``."""
    async with store.read() as conn:
        return await data.pending_tasks(conn, name, limit)


# --- retention ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pruned:
    packages: int
    tasks: int
    """Tasks of the deleted packages (those holding a member's latest content stay)."""
    rejected: int

    def filled(self, batch: int) -> bool:
        """A full batch: more may be waiting, so the loop comes back at once."""
        return max(self.packages, self.rejected) >= batch


async def prune_finished(store: Store, before: int, batch: int) -> Pruned:
    """Delete up to ``batch`` packages finished before ``before`` with their tasks, and up to ``batch`` tasks
    rejected before it, each in a short transaction of its own. Packages still ready or claimed and tasks
    still pending are never touched, nor the version log."""
    async with store.read() as conn:
        packages = await data.finished_packages_before(conn, before, batch)
        rejected = await data.rejected_tasks_before(conn, before, batch)
    async with store.transaction() as tx:
        deleted_packages, deleted_tasks = await data.delete_finished_packages(tx, packages)
    async with store.transaction() as tx:
        deleted_rejected = await data.delete_rejected_tasks(tx, rejected)
    return Pruned(deleted_packages, deleted_tasks, deleted_rejected)


# --- the dashboard --------------------------------------------------------------------------------------


async def count_by_status(store: Store) -> dict[str, dict[str, int]]:
    """Tasks and packages of every batcher counted by status."""
    async with store.read() as conn:
        return await data.count_by_status(conn)


async def mean_package_time_by_bucket(store: Store, since: int, until: int, bucket_ms: int) -> dict[int, float]:
    """Mean time from created to done (ms) of the packages done in each ``bucket_ms`` after ``since``."""
    async with store.read() as conn:
        return await data.mean_package_time_by_bucket(conn, store, since, until, bucket_ms)
