"""The dispatcher: turns the tasks really pending in the store into packages, once.

Each round locks the batcher's row (``FOR UPDATE SKIP LOCKED`` on PostgreSQL: a server that finds it
locked leaves the round to the one holding it; SQLite has one writer), reads the pending tasks, asks
``planner.plan`` what the thresholds and timers say, and writes packages, rejections and the timer state
in that same transaction. When the plan would reject tasks, the round locks those groups' numbering, reads
their version logs and plans again, so a group whose missing members were accepted before is completed by
reissuing them instead (``planner.reissues_for``); rounds that reject nothing never read the log. A task only moves ``pending → packed`` with a guarded update, so even a broken
lock could not put it in two packages.
"""

from __future__ import annotations

import logging
import uuid

from mainspring.batching import data
from mainspring.batching.cafe import expire_leases
from mainspring.batching.planner import PendingTask, Plan, Rules, TimerState, plan
from mainspring.batching.service import cafe_channel, group_lock_key, task_subject
from mainspring.core import outbox
from mainspring.core.runtime import Context, run_loop
from mainspring.store import Store, Transaction

log = logging.getLogger("mainspring.batching.dispatcher")


class DoubleFlush(RuntimeError):
    """A task was not pending any more when it was being packed: the round is rolled back."""


def new_package_id() -> str:
    return "pkg_" + uuid.uuid4().hex


async def dispatch_batcher(store: Store, name: str, leases_due: bool = True) -> int | None:
    """One dispatcher round for ``name``; answers when it must look again (epoch ms) or None."""
    async with store.transaction() as tx:
        row = await data.lock_batcher_for_round(tx, name)
        if row is None:
            return None  # another server is running this round right now
        now = store.now_ms()
        if leases_due:
            await expire_leases(tx, name, now)
        pending = await data.pending_tasks(tx, name)
        rules = Rules(row.min_size, row.max_size, row.linger_ms, row.max_wait_ms, row.group_size, row.incomplete_group)
        state = row.timer
        decided = plan(pending, rules, state, now)
        if decided.rejected or decided.needs_logs:
            decided = await plan_with_reissues(tx, name, rules, state, now, decided)
        await apply_plan(tx, name, decided, state, now)
        return decided.next_due


async def plan_with_reissues(tx: Transaction, name: str, rules: Rules, state: TimerState, now: int, decided: Plan) -> Plan:
    """Plan again with the version logs of the groups ``decided`` would reject, so those that can be are
    completed by reissue. Their numbering is locked first (as a submit does), so no submit takes a version
    a reissue is about to take; the pending tasks are read again under those locks."""
    locked: set[str] = set()
    for _ in range(3):
        wanted = ({t.group for t in decided.rejected} | decided.needs_logs) - locked
        if not wanted:
            break
        for group in sorted(wanted):
            await tx.store.dialect.advisory_xact_lock(tx, group_lock_key(name, group))
        locked |= wanted
        logs = await data.group_logs(tx, name, locked)
        decided = plan(await data.pending_tasks(tx, name), rules, state, now, logs)
    return decided


async def apply_plan(tx: Transaction, name: str, decided: Plan, state: TimerState, now: int) -> None:
    # However many packages the round makes, each kind of write is one statement: the packages, the tasks
    # moving into them, the reissued tasks, the events.
    events: list[outbox.Event] = []
    sources = await data.reissue_sources(tx, name, [t.reissue_of for t in decided.reissued if t.reissue_of])
    made: list[tuple[str, int]] = []
    waiting: list[tuple[int, str]] = []
    reissued: list[tuple[str, PendingTask]] = []
    for tasks, why in zip(decided.packages, decided.flushes, strict=True):
        package_id = new_package_id()
        made.append((package_id, len(tasks)))
        for t in tasks:
            if t.reissue_of is None:
                waiting.append((t.seq, package_id))
            else:
                reissued.append((package_id, t))
                events.append(outbox.Event(
                    "batch.task.reissued", "batch_task", task_subject(name, t.id),
                    {"batcher": name, "id": t.id, "group": t.group, "member": t.member, "version": t.version,
                     "sha256": sources[t.reissue_of].sha256, "reissue_of": t.reissue_of, "package_id": package_id},
                ))
        events.extend(
            outbox.Event("batch.task.packed", "batch_task", task_subject(name, t.id),
                         {"batcher": name, "id": t.id, "package_id": package_id})
            for t in tasks
        )
        events.append(
            outbox.Event("batch.package.created", "batch_package", package_id,
                         {"batcher": name, "size": len(tasks), "task_ids": [t.id for t in tasks], "trigger": why})
        )
    await data.insert_packages(tx, name, made, now)
    moved = await data.pack_pending_tasks(tx, waiting, now)
    if moved != len(waiting):
        raise DoubleFlush(f"batcher {name}: {len(waiting) - moved} task(s) were no longer pending")
    await data.insert_reissued(tx, name, reissued, sources, now)
    if decided.rejected:
        seqs = [t.seq for t in decided.rejected]
        if await data.reject_incomplete_tasks(tx, seqs, now) != len(seqs):
            raise DoubleFlush(f"batcher {name}: a rejected task was no longer pending")
        # The version number stays taken in the log; the content is marked as never delivered so the
        # sender may submit it again (it would otherwise count as a duplicate forever).
        await data.withdraw_versions(tx, name, [t.id for t in decided.rejected], now)
        events.extend(
            outbox.Event("batch.task.rejected", "batch_task", task_subject(name, t.id),
                         {"batcher": name, "id": t.id, "group": t.group, "member": t.member,
                          "version": t.version, "reason": "incomplete_group"})
            for t in decided.rejected
        )
    await outbox.emit_many(tx, events)
    if decided.timer != state:
        await data.save_timer(tx, name, decided.timer)
    if decided.packages:
        tx.notify(cafe_channel(name))


async def batchers_needing_a_round(store: Store) -> tuple[list[str], set[str], int | None]:
    """(batchers with pending tasks or expired leases, those with expired leases, the next lease expiry)."""
    now = store.now_ms()
    async with store.read() as conn:
        pending = await data.batchers_with_pending_tasks(conn)
        leases = await data.earliest_lease_expiries(conn)
    expired = {name for name, at in leases if at is not None and at <= now}
    upcoming = [at for _, at in leases if at is not None and at > now]
    names = sorted(set(pending) | expired)
    return names, expired, min(upcoming) if upcoming else None


async def dispatch_all(store: Store) -> int | None:
    """One round over every batcher with work; answers the earliest next due time."""
    names, expired, next_lease = await batchers_needing_a_round(store)
    dues: list[int] = [next_lease] if next_lease is not None else []
    for name in names:
        due = await dispatch_batcher(store, name, leases_due=name in expired)
        if due is not None:
            dues.append(due)
    # A due time already past (a batcher locked by another server this instant) must not spin the loop.
    return max(min(dues), store.now_ms() + 10) if dues else None


async def dispatcher_loop(ctx: Context) -> None:
    await run_loop(ctx, "batching-dispatcher", lambda: dispatch_all(ctx.store), channel="batching")
