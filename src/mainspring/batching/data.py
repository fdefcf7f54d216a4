"""Statements of the batching face, answering typed records: the version log, reissued tasks, retention and
the counts the metrics read.

(The older statements of ``service``, ``dispatcher`` and ``cafe`` still sit beside their callers; new ones
go here.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select

from mainspring.batching.planner import GroupLog, LogLine, PendingTask
from mainspring.batching.tables import batch_packages, batch_tasks, batch_versions, batchers
from mainspring.store import Transaction
from mainspring.store.dialect import Executor

LIVE_TASK_STATUSES = ("pending", "packed", "claimed")
FINISHED_PACKAGE_STATUSES = ("done", "failed")


def rowcount(result: Any) -> int:
    """Rows a DELETE or UPDATE changed (a CursorResult's count; typed loosely by ``execute``)."""
    return int(result.rowcount or 0)


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


async def batcher_exists(conn: Executor, name: str) -> bool:
    return (await conn.execute(select(batchers.c.name).where(batchers.c.name == name))).first() is not None


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
    content: Any
    data: Any


async def reissue_sources(tx: Transaction, batcher: str, task_ids: Iterable[str]) -> dict[str, ReissueSource]:
    wanted = sorted(set(task_ids))
    query = select(batch_tasks.c.id, batch_tasks.c.sha256, batch_tasks.c.content, batch_tasks.c.data).where(
        batch_tasks.c.batcher == batcher, tx.store.dialect.any_of(batch_tasks.c.id, wanted)
    )
    return {row.id: ReissueSource(*row) for row in (await tx.execute(query)).all()}


async def insert_reissued(
    tx: Transaction, batcher: str, package_id: str, tasks: Sequence[PendingTask], sources: dict[str, ReissueSource], now: int
) -> None:
    """Store reissued tasks, already packed, with their lines in the version log."""
    if not tasks:
        return
    rows = []
    lines = []
    for task in tasks:
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
        .where(batch_tasks.c.status == "rejected", batch_tasks.c.updated_at < before)
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
    query = (
        select(batch_tasks.c.batcher, batch_tasks.c.status, func.count())
        .where(batch_tasks.c.status.in_(LIVE_TASK_STATUSES))
        .group_by(batch_tasks.c.batcher, batch_tasks.c.status)
    )
    return [(str(b), str(s), int(n)) for b, s, n in (await conn.execute(query)).all()]


async def count_forming_tasks(conn: Executor) -> list[tuple[str, int]]:
    """(batcher, count) of pending tasks in a batch whose linger timer runs."""
    query = (
        select(batch_tasks.c.batcher, func.count())
        .join(batchers, batchers.c.name == batch_tasks.c.batcher)
        .where(batch_tasks.c.status == "pending", batchers.c.linger_ends_at.is_not(None))
        .group_by(batch_tasks.c.batcher)
    )
    return [(str(b), int(n)) for b, n in (await conn.execute(query)).all()]


async def count_packages(conn: Executor) -> list[tuple[str, str, int]]:
    """(batcher, status, count) of packages (finished ones until retention removes them)."""
    query = select(batch_packages.c.batcher, batch_packages.c.status, func.count()).group_by(
        batch_packages.c.batcher, batch_packages.c.status
    )
    return [(str(b), str(s), int(n)) for b, s, n in (await conn.execute(query)).all()]


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
