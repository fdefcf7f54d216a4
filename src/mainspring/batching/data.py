"""Every statement of the batching face, answering typed records: batchers and their timer, tasks and the
version log, the dispatcher's packing, the package cafe's leases, retention and the counts the metrics and
the dashboard read.

The services (``service``, ``dispatcher``, ``cafe``) decide; this module only reads and writes, in the
connection or transaction it is given, and says in each docstring what it locks.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Integer, String, TextualSelect, and_, bindparam, case, column, func, or_, select, text

from mainspring.batching.planner import GroupLog, LogLine, PendingTask, TimerState
from mainspring.batching.tables import (
    PENDING_TASK,
    REJECTED_TASK,
    batch_packages,
    batch_tasks,
    batch_versions,
    batchers,
    batching_counts,
)
from mainspring.core import data as core_data
from mainspring.store import Store, Transaction
from mainspring.store import counts as kept_counts
from mainspring.store.dialect import Executor
from mainspring.store.postgres import lock_key
from mainspring.store.schema import Millis, constant
from mainspring.types import JsonData

LIVE_TASK_STATUSES = ("pending", "packed", "claimed")
FINISHED_PACKAGE_STATUSES = ("done", "failed")


def rowcount(result: Any) -> int:
    """Rows a DELETE or UPDATE changed (a CursorResult's count; typed loosely by ``execute``)."""
    return int(result.rowcount or 0)


# --- batchers -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatcherRow:
    """A batcher's stored settings and the state of the batch it is forming (its linger timer)."""

    name: str
    min_size: int
    max_size: int
    linger_ms: int
    max_wait_ms: int
    group_size: int
    incomplete_group: str
    lease_ms: int
    linger_started_at: int | None
    linger_ends_at: int | None
    last_flush_at: int | None
    carried_through_seq: int
    created_at: int
    updated_at: int

    @property
    def timer(self) -> TimerState:
        return TimerState(self.linger_started_at, self.linger_ends_at, self.last_flush_at, self.carried_through_seq)


assert [f.name for f in dataclasses.fields(BatcherRow)] == [c.name for c in batchers.c], "BatcherRow drifted from the table"


def _batcher(row: Any) -> BatcherRow:
    return BatcherRow(*row)


async def get_batcher(conn: Executor, name: str) -> BatcherRow | None:
    row = (await conn.execute(select(batchers).where(batchers.c.name == name))).first()
    return None if row is None else _batcher(row)


async def lock_batcher(tx: Transaction, name: str) -> BatcherRow | None:
    """The batcher's row, locked until commit (``FOR UPDATE`` on PostgreSQL): settings changes and deletes
    of one batcher happen one at a time, and never during a dispatcher round."""
    query = tx.store.dialect.for_update(select(batchers).where(batchers.c.name == name))
    row = (await tx.execute(query)).first()
    return None if row is None else _batcher(row)


async def lock_batcher_for_round(tx: Transaction, name: str) -> BatcherRow | None:
    """The batcher's row locked for a dispatcher round, or None when another transaction holds it
    (``FOR UPDATE SKIP LOCKED`` on PostgreSQL: that server is running the round) or it does not exist."""
    row = (await tx.execute(tx.store.dialect.skip_locked(select(batchers).where(batchers.c.name == name)))).first()
    return None if row is None else _batcher(row)


async def batcher_exists(conn: Executor, name: str) -> bool:
    return (await conn.execute(select(batchers.c.name).where(batchers.c.name == name))).first() is not None


async def batcher_names(conn: Executor) -> list[str]:
    """Every batcher's name, in order."""
    return [row[0] for row in (await conn.execute(select(batchers.c.name).order_by(batchers.c.name))).all()]


async def insert_batcher_if_missing(tx: Transaction, name: str, settings: Mapping[str, object], now: int) -> None:
    """Create the batcher with ``settings`` and no timer; nothing happens if another transaction created it."""
    await tx.execute(
        tx.store.dialect.insert(batchers)
        .values(name=name, **settings, carried_through_seq=0, created_at=now, updated_at=now)
        .on_conflict_do_nothing(index_elements=["name"])
    )


async def update_batcher_settings(tx: Executor, name: str, settings: Mapping[str, object], now: int) -> None:
    await tx.execute(batchers.update().where(batchers.c.name == name).values(**settings, updated_at=now))


async def save_timer(tx: Executor, name: str, timer: TimerState) -> None:
    """Store the state of the batch being formed, as the dispatcher's plan left it."""
    await tx.execute(
        batchers.update()
        .where(batchers.c.name == name)
        .values(
            linger_started_at=timer.linger_started_at,
            linger_ends_at=timer.linger_ends_at,
            last_flush_at=timer.last_flush_at,
            carried_through_seq=timer.carried_through_seq,
        )
    )


async def count_batcher_tasks(conn: Executor, name: str) -> dict[str, int]:
    """The batcher's tasks counted by status (statuses it has none of are left out)."""
    return kept_counts.by_status(await kept_counts.read_counts(conn, batching_counts, "tasks", name))


async def count_batcher_packages(conn: Executor, name: str) -> dict[str, int]:
    """The batcher's packages counted by status (statuses it has none of are left out)."""
    return kept_counts.by_status(await kept_counts.read_counts(conn, batching_counts, "packages", name))


# --- tasks ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task as a submit stores it (``status`` pending, or rejected with ``reason`` duplicate)."""

    batcher: str
    id: str
    group: str
    member: str
    sha256: str
    version: int | None
    status: str
    reason: str | None
    package_id: str | None
    content: JsonData
    data: JsonData
    result: JsonData
    error: str | None
    created_at: int
    updated_at: int
    reissued: bool


@dataclass(frozen=True, slots=True)
class TaskRow(NewTask):
    """A stored task; ``seq`` orders the batcher's tasks by arrival."""

    seq: int


# A task's columns in TaskRow's order: what a submit stores, then the seq the database gives it.
_TASK_COLUMNS = [*(c for c in batch_tasks.c if c.name != "seq"), batch_tasks.c.seq]
assert [f.name for f in dataclasses.fields(TaskRow)] == [c.name for c in _TASK_COLUMNS], "TaskRow drifted from the table"


def _task(row: Any) -> TaskRow:
    return TaskRow(*row)


# Statements of every submit, built once (building one costs more than running it).
_GET_TASK = select(*_TASK_COLUMNS).where(batch_tasks.c.batcher == bindparam("batcher"), batch_tasks.c.id == bindparam("task_id"))
_INSERT_TASK = batch_tasks.insert()
_NEW_TASK_FIELDS = [field.name for field in dataclasses.fields(NewTask)]


async def get_task(conn: Executor, batcher: str, task_id: str) -> TaskRow | None:
    row = (await conn.execute(_GET_TASK, {"batcher": batcher, "task_id": task_id})).first()
    return None if row is None else _task(row)


async def insert_task(tx: Executor, task: NewTask) -> None:
    """Store a submitted task (the unique (batcher, id) makes a racing submit of the same id fail)."""
    await tx.execute(_INSERT_TASK, {name: getattr(task, name) for name in _NEW_TASK_FIELDS})


# Pending tasks, as ``ix_batch_tasks_pending`` finds them (its predicate spelled out, so both engines' planners
# use it), then by their status.
_PENDING = and_(text(PENDING_TASK), batch_tasks.c.status == "pending")


async def pending_tasks(conn: Executor, batcher: str, limit: int | None = None) -> list[PendingTask]:
    """The tasks really pending in the batcher (the batch being formed), oldest first."""
    query = (
        select(
            batch_tasks.c.seq, batch_tasks.c.id, batch_tasks.c.group, batch_tasks.c.member,
            batch_tasks.c.version, batch_tasks.c.created_at,
        )
        .where(batch_tasks.c.batcher == batcher, _PENDING)
        .order_by(batch_tasks.c.seq)
    )
    if limit is not None:
        query = query.limit(limit)
    return [PendingTask(*row) for row in (await conn.execute(query)).all()]


async def batchers_with_pending_tasks(conn: Executor) -> list[str]:
    query = select(batch_tasks.c.batcher).where(_PENDING).distinct()
    return [row[0] for row in (await conn.execute(query)).all()]


# Every task of a round moves into its package in one statement, however many tasks: on PostgreSQL from two
# array parameters, on SQLite from one JSON list of [seq, package id] pairs. Guarded on status as below.
_PACK_PENDING_TASKS_PG = text(
    "UPDATE batch_tasks SET status = 'packed', package_id = placed.package_id, updated_at = :now "
    "FROM unnest(CAST(:seqs AS bigint[]), CAST(:package_ids AS text[])) AS placed(seq, package_id) "
    "WHERE batch_tasks.seq = placed.seq AND batch_tasks.status = 'pending'"
)
_PACK_PENDING_TASKS_SQLITE = text(
    "UPDATE batch_tasks SET status = 'packed', package_id = json_extract(placed.value, '$[1]'), updated_at = :now "
    "FROM json_each(:placed) AS placed "
    # The unary + keeps SQLite from driving the join from the status index: it would then read the whole
    # JSON list once per pending task (10,000 tasks: 25 s instead of 0.04 s).
    "WHERE batch_tasks.seq = json_extract(placed.value, '$[0]') AND +batch_tasks.status = 'pending'"
)


async def pack_pending_tasks(tx: Transaction, placed: Sequence[tuple[int, str]], now: int) -> int:
    """Put pending tasks in their packages (``placed``: (seq, package id) pairs) in one statement; answers
    how many moved. Guarded on ``status = 'pending'``, so a task another round already took is not moved
    twice: the caller compares the count."""
    if not placed:
        return 0
    if tx.store.is_postgres:
        params = {"seqs": [seq for seq, _ in placed], "package_ids": [package_id for _, package_id in placed], "now": now}
        return rowcount(await tx.execute(_PACK_PENDING_TASKS_PG, params))
    return rowcount(await tx.execute(_PACK_PENDING_TASKS_SQLITE, {"placed": json.dumps(placed), "now": now}))


async def reject_incomplete_tasks(tx: Executor, seqs: Sequence[int], now: int) -> int:
    """Reject pending tasks with reason ``incomplete_group``; answers how many (guarded as ``pack_pending_tasks``)."""
    moved = await tx.execute(
        batch_tasks.update()
        .where(batch_tasks.c.seq.in_(seqs), batch_tasks.c.status == "pending")
        .values(status="rejected", reason="incomplete_group", updated_at=now)
    )
    return rowcount(moved)


async def package_tasks(conn: Executor, package_id: str) -> list[TaskRow]:
    """The tasks of a package, in arrival order."""
    query = select(*_TASK_COLUMNS).where(batch_tasks.c.package_id == package_id).order_by(batch_tasks.c.seq)
    return [_task(row) for row in (await conn.execute(query)).all()]


async def tasks_of_packages(conn: Executor, package_ids: Sequence[str], per_package: int | None = None) -> dict[str, list[TaskRow]]:
    """The tasks of each of ``package_ids`` (the first ``per_package`` of each, or all), in arrival order: one
    statement for a page of packages."""
    query = select(*_TASK_COLUMNS).where(batch_tasks.c.package_id.in_(package_ids)).order_by(batch_tasks.c.seq)
    if per_package is not None:
        place = func.row_number().over(partition_by=batch_tasks.c.package_id, order_by=batch_tasks.c.seq).label("place")
        ranked = select(*_TASK_COLUMNS, place).where(batch_tasks.c.package_id.in_(package_ids)).subquery()
        query = (select(*(ranked.c[c.name] for c in _TASK_COLUMNS)).where(ranked.c.place <= per_package)
                 .order_by(ranked.c.seq))
    found: dict[str, list[TaskRow]] = {package_id: [] for package_id in package_ids}
    for row in (await conn.execute(query)).all():
        task = _task(row)
        found[str(task.package_id)].append(task)
    return found


async def set_package_tasks_status(tx: Executor, package_id: str, status: str, now: int, *, error: str | None = None) -> None:
    """Move every task of a package to ``status`` (and set ``error``, when given, leaving it as is otherwise)."""
    values: dict[str, object] = {"status": status, "updated_at": now}
    if error is not None:
        values["error"] = error
    await tx.execute(batch_tasks.update().where(batch_tasks.c.package_id == package_id).values(**values))


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """A task's outcome as its package completes: ``done`` or ``failed``, with its result or error."""

    seq: int
    status: str
    result: JsonData
    error: str | None


_FINISH_TASK = (
    batch_tasks.update()
    .where(batch_tasks.c.seq == bindparam("outcome_seq"))
    .values(
        status=bindparam("outcome_status"),
        result=bindparam("outcome_result", type_=batch_tasks.c.result.type),
        error=bindparam("outcome_error"),
        updated_at=bindparam("now"),
    )
)


async def finish_tasks(tx: Executor, outcomes: Sequence[TaskOutcome], now: int) -> None:
    """The tasks' outcomes as their package completes, in one statement (run for each task)."""
    if not outcomes:
        return
    await tx.execute(_FINISH_TASK, [
        {"outcome_seq": o.seq, "outcome_status": o.status, "outcome_result": o.result, "outcome_error": o.error, "now": now}
        for o in outcomes
    ])


# PostgreSQL: packages locked with their tasks in one statement (the locks are on the package rows only, taken
# in seq order so two transactions locking overlapping sets never wait on each other in a cycle).
_LOCK_PACKAGES_WITH_TASKS_PG = text(
    "WITH locked AS (SELECT * FROM batch_packages WHERE id = ANY(CAST(:locked_package_ids AS text[]))"
    " ORDER BY seq FOR UPDATE) "
    "SELECT " + ", ".join(f'locked."{c.name}"' for c in batch_packages.c) + ", "
    + ", ".join(f't."{c.name}"' for c in _TASK_COLUMNS)
    + " FROM locked LEFT JOIN batch_tasks AS t ON t.package_id = locked.id ORDER BY locked.seq, t.seq"
).columns(*(column(f"p_{c.name}", c.type) for c in batch_packages.c), *(column(f"t_{c.name}", c.type) for c in _TASK_COLUMNS))


async def lock_packages_with_tasks(tx: Transaction, package_ids: Sequence[str]) -> dict[str, tuple[PackageRow, list[TaskRow]]]:
    """Packages locked until commit (``FOR UPDATE`` on PostgreSQL: their finishing writes happen one at a
    time), each with its tasks in arrival order, by id; one statement on PostgreSQL however many. Unknown
    ids are left out."""
    if not tx.store.is_postgres:
        found: dict[str, tuple[PackageRow, list[TaskRow]]] = {}
        for package_id in dict.fromkeys(package_ids):
            package = await lock_package(tx, package_id)
            if package is not None:
                found[package_id] = (package, await package_tasks(tx, package_id))
        return found
    rows = (await tx.fetch(_LOCK_PACKAGES_WITH_TASKS_PG, {"locked_package_ids": list(dict.fromkeys(package_ids))})).all()
    width = len(batch_packages.c)
    locked: dict[str, tuple[PackageRow, list[TaskRow]]] = {}
    for row in rows:
        package_id = row[1]
        if package_id not in locked:
            locked[package_id] = (_package(row[:width]), [])
        if row[width] is not None:
            locked[package_id][1].append(_task(row[width:]))
    return locked


# PostgreSQL: packages complete in one statement: every task's outcome, and the packages done (their lease
# expiry gone, their tokens kept so a repeat is recognised).
_COMPLETE_PACKAGES_PG = text(
    "WITH outcome AS (SELECT * FROM unnest(CAST(:seqs AS bigint[]), CAST(:statuses AS text[]),"
    " CAST(:results AS jsonb[]), CAST(:errors AS text[])) AS o(seq, status, result, error)), "
    "tasks AS (UPDATE batch_tasks AS t SET status = o.status, result = o.result, error = o.error, updated_at = :now"
    " FROM outcome AS o WHERE t.seq = o.seq RETURNING 1), "
    "packages AS (UPDATE batch_packages SET status = 'done', lease_expires_at = NULL, error = NULL, updated_at = :now"
    " WHERE seq = ANY(CAST(:package_seqs AS bigint[])) RETURNING 1) "
    "SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM packages)"
)


# The same, and the completions' events as its last step: the events' numbering lock (their column default, migration
# core_0006) is taken only once every task and package row is written (the insert's rows wait for both counts), and
# held until COMMIT as when the events are a statement of their own (``core.outbox``) — one round trip fewer.
_COMPLETE_PACKAGES_WITH_EVENTS_PG = text(
    str(_COMPLETE_PACKAGES_PG).removesuffix("SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM packages)")
    + ", ev AS (INSERT INTO events (type, at, subject_kind, subject_id, data)"
    " SELECT e.type, e.at, e.kind, e.subject, e.data FROM unnest(CAST(:types AS text[]), CAST(:ats AS bigint[]),"
    " CAST(:kinds AS text[]), CAST(:subjects AS text[]), CAST(:data AS jsonb[]))"
    " WITH ORDINALITY AS e(type, at, kind, subject, data, n)"
    " WHERE (SELECT count(*) FROM tasks) >= 0 AND (SELECT count(*) FROM packages) >= 0 ORDER BY e.n RETURNING 1) "
    "SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM packages), (SELECT count(*) FROM ev)"
)


async def complete_packages(
    tx: Transaction, package_seqs: Sequence[int], outcomes: Sequence[TaskOutcome], now: int,
    events: Sequence[core_data.Event] = (),
) -> bool:
    """Write completions: the tasks' outcomes and the packages ``done`` — one statement on PostgreSQL. The
    caller holds the packages' locks. On PostgreSQL, when the caller is ``tx``'s only writer (``tx.alone``: no
    other write of a group follows while the events' numbering lock is held) and this is its last statement,
    the statement writes ``events`` too, numbered; answers whether it did (if not, the caller writes them)."""
    if not tx.store.is_postgres:
        await finish_tasks(tx, outcomes, now)
        for seq in package_seqs:
            await finish_package(tx, seq, "done", None, now)
        return False
    params: dict[str, object] = {
        "seqs": [o.seq for o in outcomes], "statuses": [o.status for o in outcomes],
        "results": [json.dumps(o.result) for o in outcomes], "errors": [o.error for o in outcomes],
        "package_seqs": list(package_seqs), "now": now,
    }
    with_events = bool(events) and tx.alone and not tx.events_at_commit
    if with_events:
        at = tx.store.now_ms()
        params.update(core_data.event_columns([(event, at) for event in events]))
        tasks, packages, written = (await tx.fetch(_COMPLETE_PACKAGES_WITH_EVENTS_PG, params)).all()[0]
    else:
        tasks, packages = (await tx.fetch(_COMPLETE_PACKAGES_PG, params)).all()[0]
        written = 0
    if (tasks, packages, written) != (len(outcomes), len(package_seqs), len(events) if with_events else 0):
        # The caller holds the locks: never, but never silently.
        raise RuntimeError(f"completing packages {list(package_seqs)} wrote {tasks} task(s) of {len(outcomes)}, {packages} package(s), "
                           f"{written} event(s)")
    return with_events


# --- the version log ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VersionRow:
    member: str
    version: int
    sha256: str
    task_id: str
    at: int
    withdrawn_at: int | None


_VERSION_COLUMNS = (
    batch_versions.c.member,
    batch_versions.c.version,
    batch_versions.c.sha256,
    batch_versions.c.task_id,
    batch_versions.c.at,
    batch_versions.c.withdrawn_at,
)


async def member_versions(conn: Executor, batcher: str, group: str, member: str, after: int, limit: int) -> list[VersionRow]:
    """One member's log from ``after`` (exclusive), oldest version first, at most ``limit`` lines."""
    query = (
        select(*_VERSION_COLUMNS)
        .where(
            batch_versions.c.batcher == batcher,
            batch_versions.c.group == group,
            batch_versions.c.member == member,
            batch_versions.c.version > after,
        )
        .order_by(batch_versions.c.version)
        .limit(limit)
    )
    return [VersionRow(*row) for row in (await conn.execute(query)).all()]


async def group_versions(conn: Executor, batcher: str, group: str) -> list[VersionRow]:
    """Every member's log of one group, by member then version (a group is a handful of books)."""
    query = (
        select(*_VERSION_COLUMNS)
        .where(batch_versions.c.batcher == batcher, batch_versions.c.group == group)
        .order_by(batch_versions.c.member, batch_versions.c.version)
    )
    return [VersionRow(*row) for row in (await conn.execute(query)).all()]


@dataclass(frozen=True, slots=True)
class ContentInLog:
    """What a submit needs of its group's log, read in one statement."""

    same: int | None
    """The version this member already holds this content at (withdrawn lines do not count)."""
    own_latest: int | None
    """This member's latest version."""
    group_latest: int | None
    """The highest version in the group."""


_V = batch_versions.c
_CONTENT_IN_LOG = select(
    func.min(case((and_(_V.member == bindparam("member"), _V.sha256 == bindparam("sha256"), _V.withdrawn_at.is_(None)), _V.version))),
    func.max(case((_V.member == bindparam("member"), _V.version))),
    func.max(_V.version),
).where(_V.batcher == bindparam("batcher"), _V.group == bindparam("group"))
_INSERT_VERSION_LINE = batch_versions.insert()


async def content_in_log(tx: Executor, batcher: str, group: str, member: str, sha256: str) -> ContentInLog:
    """Where ``sha256`` and the member stand in the group's log (the caller holds the group's numbering lock)."""
    params = {"batcher": batcher, "group": group, "member": member, "sha256": sha256}
    same, own, top = (await tx.execute(_CONTENT_IN_LOG, params)).one()
    return ContentInLog(same, own, top)


# PostgreSQL: submits of different groups that arrived together, in one statement (``unnest`` arrays, one
# statement text whatever their number), prepared once per connection. Per submit, in array order: a task
# whose id is already stored is answered as it is (nothing written); otherwise its group's log decides — the
# content already accepted for the member: the task is stored ``rejected`` (duplicate) with that version;
# else the next version, ``max(own latest + 1, group's highest)``, is logged and the task stored ``pending`` —
# with its ``batch.task.accepted`` or ``batch.task.rejected`` event. The caller holds each group's numbering
# lock, taken by an earlier statement (the snapshot of this one is taken after it), and sends at most one
# submit per group and per task id.
_SUBMIT_SQL = (
    "WITH s AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[], "
    "$7::jsonb[]) WITH ORDINALITY AS s(batcher, id, grp, member, sha256, content, data, ord)), "
    "known AS (SELECT s.ord, t.seq FROM s JOIN batch_tasks t ON t.batcher = s.batcher AND t.id = s.id), "
    "log AS (SELECT s.*, "
    "(SELECT min(v.version) FROM batch_versions v WHERE v.batcher = s.batcher AND v.\"group\" = s.grp "
    "AND v.member = s.member AND v.sha256 = s.sha256 AND v.withdrawn_at IS NULL) AS same, "
    "(SELECT max(v.version) FROM batch_versions v WHERE v.batcher = s.batcher AND v.\"group\" = s.grp "
    "AND v.member = s.member) AS own, "
    "(SELECT max(v.version) FROM batch_versions v WHERE v.batcher = s.batcher AND v.\"group\" = s.grp) AS top "
    "FROM s WHERE NOT EXISTS (SELECT 1 FROM known WHERE known.ord = s.ord)), "
    "plan AS (SELECT log.*, COALESCE(same, GREATEST(COALESCE(own, 0) + 1, COALESCE(top, 0))) AS version FROM log), "
    "vl AS (INSERT INTO batch_versions (batcher, \"group\", member, version, sha256, task_id, at) "
    "SELECT batcher, grp, member, version, sha256, id, $8 FROM plan WHERE same IS NULL ORDER BY ord), "
    "ins AS (INSERT INTO batch_tasks (batcher, id, \"group\", member, sha256, version, status, reason, content, data, "
    "created_at, updated_at, reissued) SELECT batcher, id, grp, member, sha256, version, "
    "CASE WHEN same IS NULL THEN 'pending' ELSE 'rejected' END, CASE WHEN same IS NULL THEN NULL ELSE 'duplicate' END, "
    "content, data, $8, $8, false FROM plan ORDER BY ord), "
    "ev AS (INSERT INTO events (type, at, subject_kind, subject_id, data) "
    "SELECT CASE WHEN same IS NULL THEN 'batch.task.accepted' ELSE 'batch.task.rejected' END, $8, 'batch_task', "
    "batcher || '/' || id, jsonb_build_object('batcher', batcher, 'id', id, 'group', grp, 'member', member, "
    "'version', version, 'sha256', sha256) || CASE WHEN same IS NULL THEN '{}'::jsonb "
    "ELSE jsonb_build_object('reason', 'duplicate') END FROM plan ORDER BY ord) "
    "SELECT s.ord, known.seq, plan.version, plan.same IS NULL FROM s LEFT JOIN known ON known.ord = s.ord "
    "LEFT JOIN plan ON plan.ord = s.ord ORDER BY s.ord"
)
_LOCK_GROUPS = "SELECT count(*) FROM (SELECT pg_advisory_xact_lock(k) FROM unnest($1::int[]) AS k ORDER BY k) AS locked"
_TRY_LOCK_GROUPS = "SELECT bool_and(pg_try_advisory_xact_lock(k)) FROM unnest($1::int[]) AS k"


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    """How one submit of ``submit_new_tasks`` ended: ``known`` is the seq of a task already stored under its
    id (nothing written); else its ``version`` and whether it was ``accepted`` (else rejected, a duplicate)."""

    known: int | None
    version: int | None
    accepted: bool


async def lock_groups(tx: Transaction, keys: Iterable[str], *, wait: bool) -> bool:
    """PostgreSQL: take the numbering locks of these groups until commit (the advisory locks of
    ``dialect.advisory_xact_lock``), in one statement, in key order; without ``wait`` only if none is held
    elsewhere (answers False, holding some of them: the caller gives up the transaction)."""
    ints = sorted({lock_key(k) for k in keys})
    if wait:
        await tx.fetch_prepared(_LOCK_GROUPS, ints)
        return True
    return bool((await tx.fetch_prepared(_TRY_LOCK_GROUPS, ints))[0][0])


async def submit_new_tasks(tx: Transaction, tasks: Sequence[NewTask], now: int) -> list[SubmitOutcome]:
    """PostgreSQL: ``_SUBMIT_SQL`` for ``tasks`` (their version, status and reason are decided there)."""
    rows = await tx.fetch_prepared(
        _SUBMIT_SQL, [t.batcher for t in tasks], [t.id for t in tasks], [t.group for t in tasks],
        [t.member for t in tasks], [t.sha256 for t in tasks], [json.dumps(t.content) for t in tasks],
        [json.dumps(t.data) for t in tasks], now,
    )
    return [SubmitOutcome(r[1], r[2], bool(r[3])) for r in rows]


_TASK_BY_SEQ = select(*_TASK_COLUMNS).where(batch_tasks.c.seq == bindparam("seq"))


async def task_by_seq(conn: Executor, seq: int) -> TaskRow:
    return _task((await conn.execute(_TASK_BY_SEQ, {"seq": seq})).one())


async def insert_version_line(
    tx: Executor, batcher: str, group: str, member: str, version: int, sha256: str, task_id: str, at: int
) -> None:
    """A line in the permanent log (the unique (batcher, group, member, version) refuses a number twice)."""
    await tx.execute(_INSERT_VERSION_LINE, {
        "batcher": batcher, "group": group, "member": member, "version": version, "sha256": sha256, "task_id": task_id, "at": at,
    })


async def withdraw_versions(tx: Executor, batcher: str, task_ids: Sequence[str], now: int) -> None:
    """Mark the log lines of tasks rejected before they left the dispatcher as withdrawn: the number stays
    taken, the content no longer counts as accepted (sent again, it is not a duplicate)."""
    await tx.execute(
        batch_versions.update()
        .where(
            batch_versions.c.batcher == batcher,
            batch_versions.c.task_id.in_(task_ids),
            batch_versions.c.withdrawn_at.is_(None),
        )
        .values(withdrawn_at=now)
    )


# --- reissue --------------------------------------------------------------------------------------------


async def group_logs(tx: Transaction, batcher: str, groups: Iterable[str]) -> dict[str, GroupLog]:
    """What the planner needs of each group's log to complete a unit by reissue. A line counts as accepted
    content only if it is not withdrawn and its task (which holds the content to repeat) is still stored."""
    wanted = sorted(set(groups))
    logs = {group: GroupLog(accepted=[], taken=set()) for group in wanted}
    if not wanted:
        return logs
    versions, tasks = batch_versions.c, batch_tasks.c
    query = (
        select(versions.group, versions.member, versions.version, versions.task_id, versions.withdrawn_at, tasks.seq)
        .select_from(
            batch_versions.outerjoin(batch_tasks, and_(tasks.batcher == versions.batcher, tasks.id == versions.task_id))
        )
        .where(versions.batcher == batcher, tx.store.dialect.any_of(versions.group, wanted))
    )
    for group, member, version, task_id, withdrawn_at, seq in (await tx.execute(query)).all():
        log = logs[group]
        log.taken.add((member, version))
        if withdrawn_at is None and seq is not None:
            log.accepted.append(LogLine(member, version, task_id))
    # A client may have used the id a reissue would take (ids are free-form): that reissue cannot happen.
    for group in wanted:
        used = await tx.execute(
            select(tasks.id).where(tasks.batcher == batcher, tasks.id.like(f"{group}:%:v%"))
        )
        logs[group].ids_taken = {row[0] for row in used.all()}
    return logs


@dataclass(frozen=True, slots=True)
class ReissueSource:
    id: str
    sha256: str
    content: JsonData
    data: JsonData


async def reissue_sources(tx: Transaction, batcher: str, task_ids: Iterable[str]) -> dict[str, ReissueSource]:
    """The stored tasks whose content reissues repeat, by id."""
    wanted = sorted(set(task_ids))
    query = select(batch_tasks.c.id, batch_tasks.c.sha256, batch_tasks.c.content, batch_tasks.c.data).where(
        batch_tasks.c.batcher == batcher, tx.store.dialect.any_of(batch_tasks.c.id, wanted)
    )
    return {row.id: ReissueSource(*row) for row in (await tx.execute(query)).all()}


async def insert_reissued(
    tx: Transaction, batcher: str, placed: Sequence[tuple[str, PendingTask]], sources: dict[str, ReissueSource], now: int
) -> None:
    """Store reissued tasks, already packed (``placed``: (package id, task) pairs), with their lines in the
    version log."""
    if not placed:
        return
    rows = []
    lines = []
    for package_id, task in placed:
        assert task.reissue_of is not None and task.version is not None
        source = sources[task.reissue_of]
        rows.append({
            "batcher": batcher, "id": task.id, "group": task.group, "member": task.member, "sha256": source.sha256,
            "version": task.version, "status": "packed", "reason": None, "package_id": package_id,
            "content": source.content, "data": source.data, "result": None, "error": None,
            "created_at": now, "updated_at": now, "reissued": True,
        })
        lines.append({
            "batcher": batcher, "group": task.group, "member": task.member, "version": task.version,
            "sha256": source.sha256, "task_id": task.id, "at": now,
        })
    await tx.execute(batch_tasks.insert(), rows)
    await tx.execute(batch_versions.insert(), lines)


# --- packages and their leases -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PackageRow:
    """A stored package (``status`` ready | claimed | done | failed); the lease columns hold the claimer's
    token, a secret the API shows only to the claimer."""

    seq: int
    id: str
    batcher: str
    status: str
    size: int
    worker: str | None
    lease_token: str | None
    lease_expires_at: int | None
    lease_ms: int | None
    attempts: int
    error: str | None
    created_at: int
    updated_at: int


@dataclass(frozen=True, slots=True)
class PackageLease:
    """Who holds a claimed package and until when (never the token)."""

    package_id: str
    worker: str | None
    expires_at: int | None
    lease_ms: int | None


assert [f.name for f in dataclasses.fields(PackageRow)] == [c.name for c in batch_packages.c], "PackageRow drifted from the table"


def _package(row: Any) -> PackageRow:
    return PackageRow(*row)


_INSERT_PACKAGE = batch_packages.insert()


async def insert_packages(tx: Executor, batcher: str, packages: Sequence[tuple[str, int]], now: int) -> None:
    """New packages (``packages``: (id, size) pairs, in the order the cafe hands them out), ``ready``; one
    statement however many."""
    if not packages:
        return
    await tx.execute(_INSERT_PACKAGE, [
        {"id": package_id, "batcher": batcher, "status": "ready", "size": size, "attempts": 0, "created_at": now,
         "updated_at": now}
        for package_id, size in packages
    ])


async def get_package(conn: Executor, package_id: str) -> PackageRow | None:
    row = (await conn.execute(select(batch_packages).where(batch_packages.c.id == package_id))).first()
    return None if row is None else _package(row)


async def package_by_seq(conn: Executor, seq: int) -> PackageRow:
    """A package as it is now, after a change in this transaction."""
    return _package((await conn.execute(select(batch_packages).where(batch_packages.c.seq == seq))).one())


async def lock_package(tx: Transaction, package_id: str) -> PackageRow | None:
    """A package locked until commit (``FOR UPDATE`` on PostgreSQL): its finishing writes happen one at a time."""
    query = tx.store.dialect.for_update(select(batch_packages).where(batch_packages.c.id == package_id))
    row = (await tx.execute(query)).first()
    return None if row is None else _package(row)


_CLAIM_NOW = bindparam("claim_now", type_=Millis())
_CLAIM_WAITING = (
    select(batch_packages.c.seq, batch_packages.c.status.label("was"))
    .where(
        batch_packages.c.batcher == bindparam("claim_batcher"),
        or_(
            batch_packages.c.status == "ready",
            and_(batch_packages.c.status == "claimed", batch_packages.c.lease_expires_at <= _CLAIM_NOW),
        ),
    )
    .order_by(batch_packages.c.seq)
    .limit(1)
)
_CLAIM_SPAN = func.coalesce(
    bindparam("claim_lease_ms", type_=Millis()),
    select(batchers.c.lease_ms).where(batchers.c.name == bindparam("claim_batcher")).scalar_subquery(),
    bindparam("claim_default_lease_ms", type_=Millis()),
)
_CLAIM = batch_packages.update().values(
    status="claimed", worker=bindparam("claim_worker"), lease_token=bindparam("claim_token"),
    lease_expires_at=_CLAIM_NOW + _CLAIM_SPAN, lease_ms=_CLAIM_SPAN, attempts=batch_packages.c.attempts + 1,
    updated_at=_CLAIM_NOW,
)
# Pick, then lease (SQLite: one writer, no round trips; PostgreSQL claims in one statement, above).
_CLAIM_PICKED = _CLAIM.where(batch_packages.c.seq == bindparam("claim_seq")).returning(*batch_packages.c)


# PostgreSQL: the claims of one group commit in one statement: pick the oldest waiting packages, as many as
# there are claimers (SKIP LOCKED: concurrent claimers never get the same one), lease the n-th to the n-th
# claimer, and mark their tasks claimed. Alone in its transaction (autocommit, one round trip), it also writes
# each package's ``batch.package.claimed`` event and wakes the event readers of every server (pg_notify,
# delivered as it commits); sharing one, the caller writes the events last. Answers one row per task (package
# columns, the package's state before, whether it woke, the claimer's number, then task columns).
_CLAIM_COLUMNS = [*(column(f"p_{c.name}", c.type) for c in batch_packages.c), column("was", String()),
                  column("woke", Integer()), column("claimer", Integer()), *(column(f"t_{c.name}", c.type) for c in _TASK_COLUMNS)]


def _claim_many_sql(with_events: bool) -> TextualSelect:
    span = ("COALESCE(c.lease_ms, (SELECT lease_ms FROM batchers WHERE name = :claim_batcher),"
            " CAST(:claim_default_lease_ms AS bigint))")
    events = (
        "ev AS (INSERT INTO events (type, at, subject_kind, subject_id, data)"
        " SELECT 'batch.package.claimed', :claim_now, 'batch_package', picked.id, jsonb_build_object("
        "'batcher', picked.batcher, 'worker', picked.worker, 'attempt', picked.attempts,"
        " 'retaken_after_expiry', picked.was = 'claimed') FROM picked ORDER BY picked.claimer), "
        "wake AS (SELECT pg_notify(:pg_channel, :sequencer_channel) FROM picked) "
    )
    return text(
        "WITH claimers AS (SELECT * FROM unnest(CAST(:claim_workers AS text[]), CAST(:claim_tokens AS text[]),"
        " CAST(:claim_lease_ms AS bigint[])) WITH ORDINALITY AS c(worker, token, lease_ms, n)), "
        # MATERIALIZED: picked once (see ``store.dialect.picked_once``).
        "waiting AS MATERIALIZED (SELECT seq, was, row_number() OVER (ORDER BY seq) AS n FROM ("
        " SELECT seq, status AS was FROM batch_packages"
        " WHERE batcher = :claim_batcher AND (status = 'ready' OR (status = 'claimed' AND lease_expires_at <= :claim_now))"
        " ORDER BY seq LIMIT :claim_count FOR UPDATE SKIP LOCKED) AS w), "
        "picked AS (UPDATE batch_packages AS p SET status = 'claimed', worker = c.worker, lease_token = c.token,"
        f" lease_expires_at = :claim_now + {span}, lease_ms = {span}, attempts = p.attempts + 1,"
        " updated_at = :claim_now"
        " FROM waiting JOIN claimers AS c ON c.n = waiting.n WHERE p.seq = waiting.seq RETURNING "
        + ", ".join(f'p."{c.name}"' for c in batch_packages.c) + ", waiting.was, c.n AS claimer), "
        "tasks AS (UPDATE batch_tasks AS t SET status = 'claimed', updated_at = :claim_now FROM picked"
        " WHERE t.package_id = picked.id RETURNING " + ", ".join(f't."{c.name}"' for c in _TASK_COLUMNS) + ")"
        + (", " + events if with_events else " ")
        + "SELECT " + ", ".join(f'picked."{c.name}"' for c in batch_packages.c) + ", picked.was, "
        + ("(SELECT count(*) FROM wake)" if with_events else "0") + " AS woke, picked.claimer, "
        + ", ".join(f'tasks."{c.name}"' for c in _TASK_COLUMNS)
        + " FROM picked LEFT JOIN tasks ON tasks.package_id = picked.id"
    ).columns(*_CLAIM_COLUMNS)


_CLAIM_MANY_WITH_EVENTS_ALONE = _claim_many_sql(with_events=True)
_CLAIM_MANY = _claim_many_sql(with_events=False)


@dataclass(frozen=True, slots=True)
class Claimer:
    """One claim of a group: who claims, with which lease token, for how long (None: the batcher's)."""

    worker: str
    token: str
    lease_ms: int | None


@dataclass(frozen=True, slots=True)
class Claimed:
    """A package leased to its claimer, whether it was taken over after its lease expired, and its tasks."""

    package: PackageRow
    retaken: bool
    tasks: list[TaskRow]


async def claim_oldest_many(
    tx: Transaction, batcher: str, claimers: Sequence[Claimer], default_lease_ms: int, now: int, wake: tuple[str, str],
) -> tuple[list[Claimed | None], bool]:
    """``claim_oldest`` and ``claim_package_tasks`` for every claimer, the oldest waiting package to the first
    claimer; one statement on PostgreSQL. There, when ``tx.may_run_alone``, the statement is the whole of
    ``tx`` and writes the packages' ``batch.package.claimed`` events and the wake-up ``wake`` (the PostgreSQL
    channel, the event readers' channel) itself. Answers each claimer's package (None when fewer were
    waiting) and whether the events were written."""
    if not tx.store.is_postgres:
        claimed: list[Claimed | None] = []
        for c in claimers:
            picked = await claim_oldest(tx, batcher, c.worker, c.token, c.lease_ms, default_lease_ms, now)
            claimed.append(None if picked is None else Claimed(picked[0], picked[1], await claim_package_tasks(tx, picked[0].id, now)))
        return claimed, False
    alone = tx.may_run_alone
    params = {"claim_batcher": batcher, "claim_workers": [c.worker for c in claimers],
              "claim_tokens": [c.token for c in claimers], "claim_lease_ms": [c.lease_ms for c in claimers],
              "claim_count": len(claimers), "claim_default_lease_ms": default_lease_ms, "claim_now": now}
    if alone:
        params.update(pg_channel=wake[0], sequencer_channel=wake[1])
        rows = (await tx.fetch_alone(_CLAIM_MANY_WITH_EVENTS_ALONE, params)).all()
    else:
        rows = (await tx.fetch(_CLAIM_MANY, params)).all()
    width = len(batch_packages.c)
    found: dict[int, tuple[PackageRow, bool, list[TaskRow]]] = {}
    for row in rows:
        claimer = row[width + 2]
        if claimer not in found:
            found[claimer] = (_package(row[:width]), row[width] == "claimed", [])
        if row[width + 3] is not None:
            found[claimer][2].append(_task(row[width + 3:]))
    answers: list[Claimed | None] = [None] * len(claimers)
    for claimer, (package, retaken, tasks) in found.items():
        answers[claimer - 1] = Claimed(package, retaken, sorted(tasks, key=lambda t: t.seq))
    return answers, alone


async def claim_oldest(
    tx: Transaction, batcher: str, worker: str, token: str, lease_ms: int | None, default_lease_ms: int, now: int
) -> tuple[PackageRow, bool] | None:
    """Lease the oldest package of ``batcher`` waiting in the cafe (``ready``, or claimed under a lease that
    has expired) to ``worker`` with ``token``, and count the attempt: the package is picked with ``SKIP
    LOCKED`` (concurrent claimers never get the same one) and locked until commit. The lease lasts
    ``lease_ms``, else the batcher's ``lease_ms``, else ``default_lease_ms``. Answers the package as claimed
    and whether it was taken over after its lease expired, or None when none is waiting."""
    params: dict[str, object] = {"claim_batcher": batcher, "claim_worker": worker, "claim_token": token,
                              "claim_lease_ms": lease_ms, "claim_default_lease_ms": default_lease_ms, "claim_now": now}
    picked = (await tx.execute(tx.store.dialect.skip_locked(_CLAIM_WAITING), params)).first()
    if picked is None:
        return None
    row = (await tx.execute(_CLAIM_PICKED, {**params, "claim_seq": picked.seq})).one()
    return _package(row), picked.was == "claimed"


_CLAIM_PACKAGE_TASKS = (
    batch_tasks.update()
    .where(batch_tasks.c.package_id == bindparam("claimed_package_id"))
    .values(status="claimed", updated_at=bindparam("claim_now"))
    .returning(*_TASK_COLUMNS)
)


async def claim_package_tasks(tx: Executor, package_id: str, now: int) -> list[TaskRow]:
    """Mark a just claimed package's tasks ``claimed``; answers them, in arrival order."""
    rows = (await tx.execute(_CLAIM_PACKAGE_TASKS, {"claimed_package_id": package_id, "claim_now": now})).all()
    return sorted((_task(row) for row in rows), key=lambda t: t.seq)


async def lock_expired_leases(tx: Transaction, batcher: str, now: int) -> list[PackageRow]:
    """Claimed packages of ``batcher`` whose lease ran out, locked with ``SKIP LOCKED`` (a package a
    finishing worker holds right now is left to it)."""
    query = select(batch_packages).where(
        batch_packages.c.batcher == batcher,
        batch_packages.c.status == "claimed",
        batch_packages.c.lease_expires_at <= now,
    )
    return [_package(row) for row in (await tx.execute(tx.store.dialect.skip_locked(query))).all()]


async def extend_lease(tx: Executor, seq: int, lease_ms: int, now: int) -> None:
    await tx.execute(
        batch_packages.update()
        .where(batch_packages.c.seq == seq)
        .values(lease_expires_at=now + lease_ms, lease_ms=lease_ms, updated_at=now)
    )


async def put_package_back(tx: Executor, seq: int, error: str, now: int) -> None:
    """Back to the cafe (``ready``), lease ended, with why it came back."""
    await tx.execute(
        batch_packages.update()
        .where(batch_packages.c.seq == seq)
        .values(status="ready", lease_token=None, lease_expires_at=None, error=error, updated_at=now)
    )


async def finish_package(tx: Executor, seq: int, status: str, error: str | None, now: int) -> None:
    """A package ``done`` or ``failed`` for good. The token stays in the row so a repeat of the same
    finishing call is recognised; the expiry goes, so no lease expires on it."""
    await tx.execute(
        batch_packages.update()
        .where(batch_packages.c.seq == seq)
        .values(status=status, lease_expires_at=None, error=error, updated_at=now)
    )


async def list_packages(conn: Executor, batcher: str, status: str | None, after: int, limit: int) -> list[PackageRow]:
    """Packages of ``batcher`` after position ``after``, oldest first, optionally of one ``status``."""
    query = select(batch_packages).where(batch_packages.c.batcher == batcher, batch_packages.c.seq > after)
    if status:
        query = query.where(batch_packages.c.status == status)
    query = query.order_by(batch_packages.c.seq).limit(limit)
    return [_package(row) for row in (await conn.execute(query)).all()]


async def package_leases(conn: Executor, batcher: str) -> list[PackageLease]:
    """Who holds each claimed package of ``batcher``."""
    query = select(
        batch_packages.c.id, batch_packages.c.worker, batch_packages.c.lease_expires_at, batch_packages.c.lease_ms
    ).where(batch_packages.c.batcher == batcher, batch_packages.c.status == "claimed")
    return [PackageLease(*row) for row in (await conn.execute(query)).all()]


async def earliest_lease_expiries(conn: Executor) -> list[tuple[str, int | None]]:
    """(batcher, earliest lease expiry) of every batcher with claimed packages."""
    query = (
        select(batch_packages.c.batcher, func.min(batch_packages.c.lease_expires_at))
        .where(batch_packages.c.status == "claimed")
        .group_by(batch_packages.c.batcher)
    )
    return [(str(name), None if at is None else int(at)) for name, at in (await conn.execute(query)).all()]


# --- retention ------------------------------------------------------------------------------------------


async def finished_packages_before(conn: Executor, before: int, limit: int) -> list[str]:
    """Ids of packages done or failed before ``before``, oldest first."""
    query = (
        select(batch_packages.c.id)
        .where(batch_packages.c.status.in_(FINISHED_PACKAGE_STATUSES), batch_packages.c.updated_at < before)
        .order_by(batch_packages.c.updated_at)
        .limit(limit)
    )
    return [row[0] for row in (await conn.execute(query)).all()]


async def delete_finished_packages(tx: Transaction, package_ids: Sequence[str]) -> tuple[int, int]:
    """Delete finished packages and their tasks; answers (packages, tasks) deleted.

    A task holding its member's latest accepted content is kept (with its package id): it is what a
    later reissue of that member repeats. The version log is never touched: it is the permanent record
    duplicates are checked against."""
    if not package_ids:
        return 0, 0
    tasks = batch_tasks.c
    line, newer = batch_versions.alias("line"), batch_versions.alias("newer")
    # The task's own line (found by the unique (batcher, group, member, version)) with no newer accepted one.
    needed = select(line.c.seq).where(
        line.c.batcher == tasks.batcher, line.c.group == tasks.group, line.c.member == tasks.member,
        line.c.version == tasks.version, line.c.task_id == tasks.id, line.c.withdrawn_at.is_(None),
        ~select(newer.c.seq).where(
            newer.c.batcher == line.c.batcher, newer.c.group == line.c.group, newer.c.member == line.c.member,
            newer.c.version > line.c.version, newer.c.withdrawn_at.is_(None),
        ).exists(),
    )
    finished = tx.store.dialect.any_of(tasks.package_id, package_ids)
    deleted_tasks = rowcount(await tx.execute(
        batch_tasks.delete().where(finished, tasks.status.in_(("done", "failed")), ~needed.exists())
    ))
    deleted_packages = rowcount(await tx.execute(
        batch_packages.delete().where(
            tx.store.dialect.any_of(batch_packages.c.id, package_ids),
            batch_packages.c.status.in_(FINISHED_PACKAGE_STATUSES),
        )
    ))
    return deleted_packages, deleted_tasks


async def rejected_tasks_before(conn: Executor, before: int, limit: int) -> list[int]:
    """Seqs of tasks rejected before ``before`` (duplicates and incomplete groups: they never had a package)."""
    query = (
        select(batch_tasks.c.seq)
        .where(text(REJECTED_TASK), batch_tasks.c.status == "rejected", batch_tasks.c.updated_at < before)
        .order_by(batch_tasks.c.seq)
        .limit(limit)
    )
    return [row[0] for row in (await conn.execute(query)).all()]


async def delete_rejected_tasks(tx: Transaction, seqs: Sequence[int]) -> int:
    if not seqs:
        return 0
    return rowcount(await tx.execute(
        batch_tasks.delete().where(tx.store.dialect.any_of(batch_tasks.c.seq, seqs), batch_tasks.c.status == "rejected")
    ))


# --- metrics --------------------------------------------------------------------------------------------


async def count_live_tasks(conn: Executor) -> list[tuple[str, str, int]]:
    """(batcher, status, count) of tasks still in the dispatcher or the cafe."""
    counted = await kept_counts.read_counts(conn, batching_counts, "tasks")
    return [(b, s, n) for (b, s), n in counted.items() if s in LIVE_TASK_STATUSES]


async def count_forming_tasks(conn: Executor) -> list[tuple[str, int]]:
    """(batcher, count) of pending tasks in a batch whose linger timer runs: the kept count of the pending
    tasks of each batcher whose timer runs (a count of the tasks read 20,000 index entries at 1M tasks)."""
    lingering = set((await conn.execute(select(batchers.c.name).where(batchers.c.linger_ends_at.is_not(None)))).scalars())
    if not lingering:
        return []
    counted = await kept_counts.read_counts(conn, batching_counts, "tasks", status="pending")
    return [(batcher, n) for (batcher, _status), n in counted.items() if batcher in lingering]


async def count_packages(conn: Executor) -> list[tuple[str, str, int]]:
    """(batcher, status, count) of packages (finished ones until retention removes them)."""
    return [(b, s, n) for (b, s), n in (await kept_counts.read_counts(conn, batching_counts, "packages")).items()]


# --- removing a batcher ---------------------------------------------------------------------------------


async def held_packages(conn: Executor, batcher: str, now: int) -> int:
    """Packages of ``batcher`` claimed under a lease that has not expired (a worker may still finish them)."""
    query = select(func.count()).select_from(batch_packages).where(
        batch_packages.c.batcher == batcher,
        batch_packages.c.status == "claimed",
        batch_packages.c.lease_expires_at > now,
    )
    return int((await conn.execute(query)).scalar() or 0)


@dataclass(frozen=True, slots=True)
class Removed:
    tasks: int
    packages: int
    versions: int


async def delete_batcher_rows(tx: Transaction, batcher: str) -> Removed:
    """Delete every row of ``batcher``: its tasks, packages, version log and settings (the caller holds the
    settings row)."""
    tasks = rowcount(await tx.execute(batch_tasks.delete().where(batch_tasks.c.batcher == batcher)))
    packages = rowcount(await tx.execute(batch_packages.delete().where(batch_packages.c.batcher == batcher)))
    versions = rowcount(await tx.execute(batch_versions.delete().where(batch_versions.c.batcher == batcher)))
    await tx.execute(batchers.delete().where(batchers.c.name == batcher))
    return Removed(tasks, packages, versions)


# --- the dashboard --------------------------------------------------------------------------------------


async def count_by_status(conn: Executor) -> dict[str, dict[str, int]]:
    """Tasks and packages counted by status."""
    return {kind: kept_counts.by_status(await kept_counts.read_counts(conn, batching_counts, kind))
            for kind in ("tasks", "packages")}


async def mean_package_time_by_bucket(conn: Executor, store: Store, since: int, until: int, bucket_ms: int) -> dict[int, float]:
    """Mean time from created to done (ms) of the packages done in each ``bucket_ms`` after ``since`` (of a sample:
    ``core.data.mean_duration_by_bucket``, on ``ix_batch_packages_status_updated_at``)."""
    return await core_data.mean_duration_by_bucket(
        conn, batch_packages.c.created_at, batch_packages.c.updated_at, batch_packages.c.status == constant("done"), since, until,
        bucket_ms, postgres=store.is_postgres,
    )
