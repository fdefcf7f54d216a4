"""Background work of the machines face: due timers and pending notifications, taken with leases.

Any server takes due machines: it stamps them with a lease (token + expiry) so others leave them alone
while it calls the processor. A server that dies mid-step simply lets the lease expire; the next server
to look redoes the step. The version check in ``steps`` makes sure an answer is applied at most once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, or_, select

from mainspring.core.leases import new_token
from mainspring.core.runtime import Context, log_failure, run_loop
from mainspring.machines.commit import committer
from mainspring.machines.errors import NamespaceNotFound
from mainspring.machines.namespaces import Namespace, find_namespace, processor_for
from mainspring.machines.processor import ProcessorError
from mainspring.machines.retry import next_delay_ms
from mainspring.machines.steps import (
    CHANNEL,
    fail_machine,
    journal,
    processor_view,
    read_history,
    refresh_notify_at,
    stepped_since,
)
from mainspring.machines.tables import machines, namespaces, notifications

log = logging.getLogger("mainspring.machines")

INFLIGHT = "machines:inflight"
INFLIGHT_COUNT = "machines:inflight-count"


async def lease_due_machines(ctx: Context, limit: int) -> list[Any]:
    """Lease up to ``limit`` working machines whose timer or head notification is due."""
    store = ctx.store
    now = ctx.now_ms()
    lookahead = ctx.settings.machines.timer_lookahead_ms
    margin = ctx.settings.machines.lease_margin_ms + lookahead
    token = new_token()
    async with store.transaction() as tx:
        due = (
            select(machines.c.uid, machines.c.namespace)
            .where(machines.c.status == "working", machines.c.wake_at <= now + lookahead, or_(machines.c.lease_until.is_(None), machines.c.lease_until <= now))
            .order_by(machines.c.wake_at)
            .limit(limit)
        )
        rows = (await tx.execute(store.dialect.skip_locked(due))).all()
        if not rows:
            return []
        names = {r.namespace for r in rows}
        timeouts = dict((await tx.execute(select(namespaces.c.name, namespaces.c.timeout_ms).where(namespaces.c.name.in_(names)))).all())
        default_timeout = 30_000
        lease_until = case(
            *((machines.c.namespace == name, now + timeout + margin) for name, timeout in timeouts.items()),
            else_=now + default_timeout + margin,
        ) if timeouts else now + default_timeout + margin
        uids = [r.uid for r in rows]
        await tx.execute(machines.update().where(machines.c.uid.in_(uids)).values(lease_token=token, lease_until=lease_until))
        return list((await tx.execute(select(machines).where(machines.c.uid.in_(uids)))).all())


async def next_wake(ctx: Context) -> int | None:
    """When a machine is next due (or its lease next runs out)."""
    when = case((machines.c.lease_until > machines.c.wake_at, machines.c.lease_until), else_=machines.c.wake_at)
    async with ctx.store.read() as conn:
        value = (await conn.execute(select(func.min(when)).where(machines.c.status == "working", machines.c.wake_at.is_not(None)))).scalar()
    return int(value) if value is not None else None


@dataclass
class Due:
    """A leased machine with what its step needs, read ahead of its due time."""

    row: Any
    namespace: Namespace | None
    head: Any
    events: list[dict[str, Any]]


async def read_due(ctx: Context, rows: list[Any]) -> list[Due]:
    """Read namespace, head notification and history of every leased machine in one read transaction."""
    found: dict[str, Namespace | None] = {}
    prepared = []
    async with ctx.store.read() as conn:
        for row in rows:
            if row.namespace not in found:
                try:
                    found[row.namespace] = await find_namespace(conn, ctx, row.namespace)
                except NamespaceNotFound:
                    found[row.namespace] = None
            ns = found[row.namespace]
            if ns is None:
                prepared.append(Due(row, None, None, []))
                continue
            head = (
                await conn.execute(select(notifications).where(notifications.c.machine_uid == row.uid).order_by(notifications.c.seq).limit(1))
            ).first()
            prepared.append(Due(row, ns, head, await read_history(conn, row, ns.config.history)))
    return prepared


async def run_due_step(ctx: Context, row: Any) -> None:
    """Fire the due timer or deliver the head notification of one leased machine."""
    (due,) = await read_due(ctx, [row])
    await fire(ctx, due)


async def fire(ctx: Context, due: Due) -> None:
    """Wait for the due millisecond, ask the processor, and apply (group-committed) or record its failure."""
    row, ns, head, events = due.row, due.namespace, due.head, due.events
    if ns is None:
        log.warning("machine %s/%s is due but its namespace is gone", row.namespace, row.id)
        return
    await _until(ctx, row.wake_at)
    if stepped_since(ctx, row):
        # A Call on this server moved the machine on while the timer waited: read it again.
        await _release(ctx, row)
        return
    now = ctx.now_ms()
    timer_due = row.timer_at is not None and row.timer_at <= now
    if timer_due and (head is None or head.due_at > now or row.timer_at <= head.due_at):
        kind, args = "timeout", None
    elif head is not None and head.due_at <= now:
        kind, args = "notification", head.args
    else:
        await _release(ctx, row)
        return
    try:
        answer = await processor_for(ctx, ns).process(kind, args, processor_view(row, events), ns.timeout_ms, ctx.now_ms())
    except ProcessorError as error:
        await _record_failure(ctx, ns, row, kind, head if kind == "notification" else None, error)
        return
    except Exception as error:  # A namespace without a processor on this server: retry like a transient error.
        await _record_failure(ctx, ns, row, kind, head if kind == "notification" else None, ProcessorError(str(error)))
        return
    applied = await committer(ctx.extras, ctx.store).apply(row, answer, consume_timer=kind == "timeout", delivered_notification=head.seq if kind == "notification" else None)
    if not applied:
        await _release(ctx, row)


async def _until(ctx: Context, due: int | None) -> None:
    """Wait for the due millisecond on the store's clock (a manual clock in tests wakes every waiter)."""
    while due is not None and not ctx.stopping.is_set():
        remaining = due - ctx.now_ms()
        if remaining <= 0:
            return
        await ctx.store.notifier.waiter("machines-clock").wait(remaining / 1000)


async def _release(ctx: Context, row: Any) -> None:
    async with ctx.store.transaction() as tx:
        await tx.execute(
            machines.update().where(machines.c.uid == row.uid, machines.c.lease_token == row.lease_token).values(lease_token=None, lease_until=None)
        )


async def _record_failure(ctx: Context, ns: Namespace, row: Any, kind: str, head: Any, error: ProcessorError) -> None:
    """A transient error schedules a retry by the namespace's policy; a permanent or a spent one fails the machine."""
    now = ctx.now_ms()
    if kind == "timeout":
        attempts, since = row.retry_attempt + 1, row.retry_since or now
    else:
        attempts, since = head.attempts + 1, head.first_failed_at or now
    delay = None if error.permanent else next_delay_ms(ns.retry, attempts, now - since)
    async with ctx.store.transaction() as tx:
        if delay is None:
            await fail_machine(tx, row, kind, error, attempts)
            return
        guard = (machines.c.uid == row.uid, machines.c.version == row.version, machines.c.lease_token == row.lease_token)
        if kind == "timeout":
            retry_at = now + delay
            result = await tx.execute(
                machines.update().where(*guard).values(
                    timer_at=retry_at, retry_attempt=attempts, retry_since=since, lease_token=None, lease_until=None,
                    wake_at=case((machines.c.notify_at < retry_at, machines.c.notify_at), else_=retry_at),
                )
            )
        else:
            result = await tx.execute(machines.update().where(*guard).values(lease_token=None, lease_until=None))
            if result.rowcount:
                await tx.execute(
                    notifications.update().where(notifications.c.seq == head.seq).values(attempts=attempts, first_failed_at=since, due_at=now + delay)
                )
                await refresh_notify_at(tx, row.uid)
        if result.rowcount:
            await journal(tx, row.uid, kind, error.code, error.detail, permanent=False, attempt=attempts, outcome="retry")
            tx.notify(CHANNEL)


async def take_due_timers(ctx: Context) -> int | None:
    """One round: lease what is due (as far as free workers allow), start its steps, answer the next due time."""
    inflight: set[asyncio.Task[None]] = ctx.extras.setdefault(INFLIGHT, set())
    counts: dict[str, int] = ctx.extras.setdefault(INFLIGHT_COUNT, {"rows": 0})
    free = ctx.settings.machines.concurrency - counts["rows"]
    if free > 0:
        rows = await lease_due_machines(ctx, min(free, ctx.settings.machines.batch))
        if rows:
            counts["rows"] += len(rows)
            task = asyncio.create_task(_guarded(ctx, rows))
            inflight.add(task)

            def finished(t: asyncio.Task[None], n: int = len(rows)) -> None:
                inflight.discard(t)
                counts["rows"] -= n
                ctx.store.notifier.signal(CHANNEL)

            task.add_done_callback(finished)
        if len(rows) == free:
            return None  # every worker is busy; a finishing batch wakes the loop
        if rows:
            return ctx.now_ms()
    due = await next_wake(ctx)
    return None if due is None else due - ctx.settings.machines.timer_lookahead_ms


async def _guarded(ctx: Context, rows: list[Any]) -> None:
    try:
        prepared = await read_due(ctx, rows)
    except Exception as exc:
        log_failure(log, exc, "reading %d due machines failed; their leases will expire and they will be retried", len(rows))
        return
    await asyncio.gather(*(_fire_guarded(ctx, due) for due in prepared))


async def _fire_guarded(ctx: Context, due: Due) -> None:
    try:
        await fire(ctx, due)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log_failure(log, exc, "background step of machine %s/%s failed; its lease will expire and it will be retried", due.row.namespace, due.row.id)


async def machines_loop(ctx: Context) -> None:
    """Fire due timers and deliver notifications until the server stops."""
    try:
        await run_loop(ctx, "machines-due", lambda: take_due_timers(ctx), channel=CHANNEL)
    finally:
        inflight: set[asyncio.Task[None]] = ctx.extras.get(INFLIGHT, set())
        for task in list(inflight):
            task.cancel()
        await asyncio.gather(*inflight, return_exceptions=True)

