"""Background work of the machines face: due timers and pending notifications, taken with leases.

Every server takes due machines: it leases them (``core.leases``: a token and an expiry in the row) so others
leave them alone while it calls the processor. A server that dies mid-step simply lets the lease expire; the
next server to look redoes the step. The version guard in ``steps`` makes sure an answer is applied at most
once. A leased batch comes with its namespaces (PostgreSQL: in the lease's own statement) and is read with one
or two queries for the whole batch (whole histories; head notifications when any machine has some), not a
few per machine.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from mainspring.core.leases import new_token
from mainspring.core.runtime import Context, log_failure, run_loop
from mainspring.machines import data, metrics
from mainspring.machines.data import Applied, HistoryRow, LeasedBatch, MachineRow, NotificationRow
from mainspring.machines.errors import NamespaceNotFound
from mainspring.machines.namespaces import Namespace, local_target, namespace_of, processor_for
from mainspring.machines.processor import Driver, ProcessorError, Step
from mainspring.machines.retry import next_delay_ms
from mainspring.machines.settings import HistoryRange
from mainspring.machines.steps import (
    CHANNEL,
    applied_once,
    fail_machine,
    journal,
    pending_step,
    processor_view,
    stepped_since,
)

log = logging.getLogger("mainspring.machines")

INFLIGHT = "machines:inflight"
ONLY = "machines:only-namespaces"
"""In ``Context.extras``: the namespaces this process takes due machines of (absent: all). ``mainspring worker``
runs its app's workflows' namespaces only: other processors are called by the servers."""
INFLIGHT_COUNT = "machines:inflight-count"


async def lease_due_machines(ctx: Context, limit: int) -> LeasedBatch:
    """Lease up to ``limit`` working machines whose timer or head notification is due (or soon due), with
    their namespaces."""
    now = ctx.now_ms()
    lookahead = ctx.settings.machines.timer_lookahead_ms
    margin = ctx.settings.machines.lease_margin_ms + lookahead
    async with ctx.store.transaction(alone=True) as tx:
        return await data.lease_due(tx, now, now + lookahead, limit, new_token(), margin, ctx.extras.get(ONLY))


async def next_wake(ctx: Context) -> int | None:
    """When a machine is next due (or its lease next runs out)."""
    async with ctx.store.read() as conn:
        return await data.next_wake(conn)


@dataclass
class Due:
    """A leased machine with what its step needs, read ahead of its due time."""

    machine: MachineRow
    namespace: Namespace | None
    head: NotificationRow | None
    events: list[HistoryRow]


async def read_due(ctx: Context, batch: LeasedBatch) -> list[Due]:
    """Read the head notification and history of every leased machine: one or two queries for the batch.

    The heads are read after the rows were leased, so a head may be newer than its row (a notification that
    arrived since); it can never be older, because delivering a notification moves the version on, and the
    step is applied only at the version leased. Only machines with a pending notification when leased
    (``notify_at``) are asked for theirs: one that arrived since is due no earlier than the lease, so it never
    goes before a due timer, and the next lease delivers it."""
    found: dict[str, Namespace | None] = {}
    for name, stored in batch.namespaces.items():
        try:
            found[name] = namespace_of(ctx, name, stored)
        except NamespaceNotFound:
            found[name] = None
    leased = batch.machines
    async with ctx.store.read() as conn:
        # A driven namespace's machines read their own history and notifications (``processor.Driver``).
        live = [m for m in leased if found[m.namespace] is not None and driver_of(ctx, found[m.namespace]) is None]
        heads = await data.head_notifications(conn, [m.uid for m in live if m.notify_at is not None])
        whole = [m for m in live if _whole(found[m.namespace])]
        histories = await data.whole_histories(conn, whole)
        for m in live:
            if m.uid not in histories:
                rng = found[m.namespace].config.history  # type: ignore[union-attr]
                histories[m.uid] = await data.read_history(conn, m, rng.after, rng.limit, rng.direction == "backward")
    return [Due(m, found[m.namespace], heads.get(m.uid), histories.get(m.uid, [])) for m in leased]


def _whole(ns: Namespace | None) -> bool:
    """Whether the namespace sends its processor the whole history (the default range)."""
    if ns is None:
        return False
    rng = ns.config.history
    return rng.after is None and rng.limit is None and rng.direction == "forward"


def driver_of(ctx: Context, ns: Namespace | None) -> Driver | None:
    """The in-process processor that drives the machines of ``ns`` itself, if it is one."""
    if ns is None or ns.config.processor.url is not None:
        return None
    target = local_target(ctx, ns.name)
    return target if isinstance(target, Driver) else None


async def fire(ctx: Context, due: Due) -> None:
    """Wait for the due millisecond, ask the processor, and apply (group-committed) or record its failure."""
    machine, ns, head = due.machine, due.namespace, due.head
    if ns is None:
        log.warning("machine %s/%s is due but its namespace is gone", machine.namespace, machine.id)
        return
    await _until(ctx, machine.wake_at)
    driver = driver_of(ctx, ns)
    if driver is not None:
        # The lease passes to the driver, which answers at once and advances the machine on its own.
        await driver.drive(ctx, machine)
        return
    if stepped_since(ctx.extras, machine):
        # A Call on this server moved the machine on while the timer waited: read it again.
        await _release(ctx, machine)
        return
    now = ctx.now_ms()
    timer_due = machine.timer_at is not None and machine.timer_at <= now
    if timer_due and (head is None or head.due_at > now or machine.timer_at <= head.due_at):  # type: ignore[operator]
        kind, args, delivering = "timeout", None, None
    elif head is not None and head.due_at <= now:
        kind, args, delivering = "notification", head.args, head
    else:
        await _release(ctx, machine)
        return
    if kind == "timeout":
        metrics.timer_fired(machine.namespace, now - machine.timer_at)  # type: ignore[operator]
    rng, timeout_ms, events = await _step_history(ctx, ns, due, kind)
    try:
        answer = await processor_for(ctx, ns).process(kind, args, processor_view(machine, events), timeout_ms, ctx.now_ms(), step=Step(rng, machine.timer_at))
    except ProcessorError as error:
        metrics.count_processor_error(machine.namespace, kind, error.code)
        await _record_failure(ctx, ns, machine, kind, delivering, error)
        return
    except Exception as error:  # A namespace without a processor on this server: retry like a transient error.
        metrics.count_processor_error(machine.namespace, kind, "processor_failed")
        await _record_failure(ctx, ns, machine, kind, delivering, ProcessorError(str(error)))
        return
    delivered = delivering.seq if delivering is not None else None
    step = pending_step(machine, answer, ctx.now_ms(), consume_timer=kind == "timeout", delivered_notification=delivered)
    applied = await applied_once(ctx.store, step)
    if applied is Applied.APPLIED:
        metrics.step_applied(machine.namespace, kind)
    else:
        await _release(ctx, machine)


async def _step_history(ctx: Context, ns: Namespace, due: Due, kind: str) -> tuple[HistoryRange, int, list[HistoryRow]]:
    """The range, timeout and history of a background step: the timer's or the notification's own range
    (Machinegun's SetTimerAction.range, Notify's descriptor range) when it has one, else the namespace's.
    ``read_due`` read the namespace's range for the whole batch; only an own range costs another read."""
    own = due.machine.timer_range if kind == "timeout" else due.head.history_range if due.head is not None else None
    timeout_ms = (due.machine.timer_timeout_ms if kind == "timeout" else None) or ns.timeout_ms
    if own is None:
        return ns.config.history, timeout_ms, due.events
    rng = HistoryRange.model_validate(own)
    async with ctx.store.read() as conn:
        events = await data.read_history(conn, due.machine, rng.after, rng.limit, rng.direction == "backward")
    return rng, timeout_ms, events


async def _until(ctx: Context, due: int | None) -> None:
    """Wait for the due millisecond on the store's clock (a manual clock in tests wakes every waiter)."""
    while due is not None and not ctx.stopping.is_set():
        remaining = due - ctx.now_ms()
        if remaining <= 0:
            return
        await ctx.store.notifier.waiter("machines-clock").wait(remaining / 1000)


async def _release(ctx: Context, machine: MachineRow) -> None:
    assert machine.lease_token is not None
    async with ctx.store.transaction() as tx:
        await data.release(tx, machine.uid, machine.lease_token)


async def _record_failure(ctx: Context, ns: Namespace, machine: MachineRow, kind: str, head: NotificationRow | None, error: ProcessorError) -> None:
    """A transient error schedules a retry by the namespace's policy; a permanent or a spent one fails the machine."""
    now = ctx.now_ms()
    if head is None:
        attempts, since = machine.retry_attempt + 1, machine.retry_since or now
    else:
        attempts, since = head.attempts + 1, head.first_failed_at or now
    policy = (ns.config.retries.timers if head is None else ns.config.retries.notifications) or ns.retry
    delay = None if error.permanent else next_delay_ms(policy, attempts, now - since)
    async with ctx.store.transaction() as tx:
        if delay is None:
            await fail_machine(tx, machine, kind, error, attempts)
            return
        if head is None:
            kept = await data.retry_timer_later(tx, machine, now + delay, attempts, since)
        else:
            kept = await data.release_at_version(tx, machine)
            if kept:
                await data.reschedule_notification(tx, head.seq, attempts, since, now + delay)
                await data.refresh_notify_at(tx, machine.uid)
        if kept:
            await journal(tx, machine.uid, kind, error.code, error.detail, permanent=False, attempt=attempts, outcome="retry")
            tx.notify(CHANNEL)


async def take_due_timers(ctx: Context) -> int | None:
    """One round: lease what is due (as far as free workers allow), start its steps, answer the next due time."""
    inflight: set[asyncio.Task[None]] = ctx.extras.setdefault(INFLIGHT, set())
    counts: dict[str, int] = ctx.extras.setdefault(INFLIGHT_COUNT, {"rows": 0})
    concurrency = ctx.settings.machines.concurrency
    free = concurrency - counts["rows"]
    if free > 0:
        # At most half the workers per batch: the next batch is leased and read while this one's steps run and
        # commit, instead of every worker waiting for the slowest step of one batch before anything is leased.
        batch = await lease_due_machines(ctx, min(free, ctx.settings.machines.batch, max(1, concurrency // 2)))
        leased = batch.machines
        if leased:
            counts["rows"] += len(leased)
            task = asyncio.create_task(_guarded(ctx, batch, counts))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
        if len(leased) == free:
            return None  # every worker is busy; a finishing batch wakes the loop
        if leased:
            return ctx.now_ms()
    due = await next_wake(ctx)
    return None if due is None else due - ctx.settings.machines.timer_lookahead_ms


def _free(ctx: Context, counts: dict[str, int], n: int) -> None:
    counts["rows"] -= n
    ctx.store.notifier.signal(CHANNEL)


async def _guarded(ctx: Context, batch: LeasedBatch, counts: dict[str, int]) -> None:
    try:
        prepared = await read_due(ctx, batch)
    except BaseException as exc:
        _free(ctx, counts, len(batch.machines))
        if not isinstance(exc, Exception):
            raise
        log_failure(log, exc, "reading %d due machines failed; their leases will expire and they will be retried", len(batch.machines))
        return
    await asyncio.gather(*(_fire_guarded(ctx, due, counts) for due in prepared))


async def _fire_guarded(ctx: Context, due: Due, counts: dict[str, int]) -> None:
    # Each machine gives its worker back as its own step ends, not when the slowest of its batch does: a driven
    # machine (a workflow run) is handed over at its due millisecond, and the next due ones are leased at once.
    try:
        await fire(ctx, due)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log_failure(log, exc, "background step of machine %s/%s failed; its lease will expire and it will be retried", due.machine.namespace, due.machine.id)
    finally:
        _free(ctx, counts, 1)


async def machines_loop(ctx: Context) -> None:
    """Fire due timers and deliver notifications until the server stops."""
    try:
        await run_loop(ctx, "machines-due", lambda: take_due_timers(ctx), channel=CHANNEL)
    finally:
        inflight: set[asyncio.Task[None]] = ctx.extras.get(INFLIGHT, set())
        for task in list(inflight):
            task.cancel()
        await asyncio.gather(*inflight, return_exceptions=True)
