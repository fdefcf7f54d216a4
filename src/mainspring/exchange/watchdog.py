"""The watchdog loop and start-up recovery.

Watchdog: STARTED past its deadline → CANCELLED (messages available again); READY_TO_COMMIT past its
commit deadline → IN_DOUBT (files to ``unknown/<process_id>/``, an alert); pending file moves retried.
Start-up: CANCELLED dropped, CLEANUP finished, READY_TO_COMMIT → IN_DOUBT, STARTED keep their deadline.
Each step is a bounded batch and may be interrupted anywhere: running it again ends the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time

from mainspring.core import outbox
from mainspring.core.alerts import raise_alerts
from mainspring.core.runtime import Context, run_loop
from mainspring.exchange import data, sync
from mainspring.exchange.messages import WATCHDOG_CHANNEL
from mainspring.exchange.service import SUBJECT, abort

log = logging.getLogger("mainspring.exchange")


async def cancel_expired(ctx: Context) -> int:
    """STARTED processes past their deadline → CANCELLED; answers how many."""
    store = ctx.store
    async with store.transaction() as tx:
        now = store.now_ms()
        rows = await data.take_expired_started(tx, now, ctx.settings.exchange.batch_size)
        for row in rows:
            log.info("process %s of %s/%s passed its deadline: CANCELLED", row.id, row.addressee, row.database)
            await abort(tx, row, "the process deadline passed without API_3", state="CANCELLED")
    return len(rows)


async def doubt_ready(ctx: Context, *, expired_only: bool = True) -> int:
    """READY_TO_COMMIT processes (past their commit deadline, or all at start-up) → IN_DOUBT."""
    store = ctx.store
    async with store.transaction() as tx:
        now = store.now_ms()
        rows = await data.take_ready_processes(tx, now, ctx.settings.exchange.batch_size, expired_only=expired_only)
        if not rows:
            return 0
        await data.put_in_doubt(tx, [r.id for r in rows], now)
        reason = "its commit deadline passed" if expired_only else "the server restarted"
        await outbox.emit_many(tx, [
            outbox.Event("exchange.process.in_doubt", SUBJECT, r.id,
                         {"addressee": r.addressee, "database": r.database, "state": "IN_DOUBT",
                          "previous": "READY_TO_COMMIT", "reason": reason})
            for r in rows
        ])
        await raise_alerts(tx, "exchange_in_doubt", SUBJECT, [
            (r.id, f"process {r.id} of {r.addressee}/{r.database} (client {r.client_id}) is IN_DOUBT: {reason} "
                   "before the client said whether its database committed. Its messages are kept in "
                   f"unknown/{r.id}/ until the client (or POST /v1/exchange/processes/{r.id}/resolve) tells.")
            for r in rows
        ])
    return len(rows)


async def _drain(step: object, *args: object, **kwargs: object) -> int:
    total = 0
    while True:
        handled = await step(*args, **kwargs)  # type: ignore[operator]
        total += handled
        if not handled:
            return total


async def next_due(ctx: Context) -> int | None:
    async with ctx.store.read() as conn:
        deadline = await data.next_process_deadline(conn)
        files_due = await data.next_file_move_due(conn)
    due = [d for d in (deadline, files_due) if d is not None]
    return min(due) if due else None


async def watchdog_step(ctx: Context) -> int | None:
    """One round of the watchdog; answers when the next deadline or retry is due."""
    await _drain(cancel_expired, ctx)
    await _drain(doubt_ready, ctx)
    # Each batch either syncs rows or pushes their retry time past now, so this ends.
    await _drain(sync.sync_files, ctx)
    return await next_due(ctx)


async def watchdog(ctx: Context) -> None:
    """The exchange's background loop."""
    await run_loop(ctx, "exchange-watchdog", lambda: watchdog_step(ctx), channel=WATCHDOG_CHANNEL,
                   poll_ms=ctx.settings.exchange.watchdog_interval_ms)


async def drop_cancelled(ctx: Context) -> int:
    async with ctx.store.transaction() as tx:
        return await data.delete_cancelled_processes(tx)


async def finish_all_cleanups(ctx: Context) -> int:
    total = 0
    after = ""
    while True:
        async with ctx.store.transaction() as tx:
            ids = await data.cleanup_process_ids(tx, after, ctx.settings.exchange.batch_size)
            if not ids:
                return total
            total += await sync.finish_cleanups(tx, ids)
        after = ids[-1]


async def recover(ctx: Context) -> None:
    """Start-up recovery, as API.md says; safe to run again after a crash half-way."""
    started = time.monotonic()
    dropped = await drop_cancelled(ctx)
    # Putting processes in doubt waits on the store, the file moves already pending (mostly the deletions of
    # CLEANUP processes: an unlink waits ~1 ms on a disk mounted with discard) on the disk: both at once. A
    # move and a newer decision about the same file meet as they do between servers (file_version).
    async with asyncio.TaskGroup() as both:
        doubting = both.create_task(_drain(doubt_ready, ctx, expired_only=False))
        syncing = both.create_task(sync.sync_all_once(ctx))
    doubted, moved = doubting.result(), syncing.result()
    # The quarantine moves of processes put in doubt behind the pass above: due now (a move that failed above
    # is due only after its retry delay, as the watchdog would have it).
    moved += await sync.sync_all_once(ctx, due_by=ctx.store.now_ms())
    done = await finish_all_cleanups(ctx)
    log.info(
        "exchange recovery: %d cancelled dropped, %d ready-to-commit now in doubt, %d file moves, "
        "%d cleanups finished in %.2fs", dropped, doubted, moved, done, time.monotonic() - started,
    )
