"""Finished processes leave the list (seed 000: "по успешному удалению процесс удаляется из списка процессов").

A DONE or ABORTED process is removed ``exchange.finished_retention_ms`` after it finished, together with the
message rows that ended with it, once its cleanup is over — never while a file of its messages or replies
still waits to be moved or deleted. Every server runs the loop; each batch locks what it removes, so two
servers never remove the same process, and a late API_4/API_5 racing the removal meets either the process
or nothing.
"""

from __future__ import annotations

import logging

from mainspring.core import outbox
from mainspring.core.runtime import Context, run_loop
from mainspring.exchange import data
from mainspring.exchange.messages import FINISHED_CHANNEL

log = logging.getLogger("mainspring.exchange")

RETENTION_CHANNEL = "exchange:retention"


async def remove_finished_processes(ctx: Context) -> int:
    """Remove one batch of finished processes past their retention; answers how many."""
    retention = ctx.settings.exchange.finished_retention_ms
    if retention is None:
        return 0
    async with ctx.store.transaction() as tx:
        removable = await data.take_removable_processes(tx, ctx.now_ms() - retention, ctx.settings.exchange.batch_size)
        if not removable:
            return 0
        messages = await data.delete_processes_with_their_messages(tx, [p.id for p in removable])
        await outbox.emit_many(tx, [
            outbox.Event("exchange.process.removed", "exchange.process", p.id,
                         {"addressee": p.addressee, "database": p.database, "state": p.state})
            for p in removable
        ])
    log.info("removed %d finished processes and %d of their message rows", len(removable), messages)
    return len(removable)


async def retention_step(ctx: Context) -> int | None:
    """One round of the retention loop; answers when the next finished process falls due (None: none yet)."""
    retention = ctx.settings.exchange.finished_retention_ms
    if retention is None:
        return None
    removed = await remove_finished_processes(ctx)
    if removed >= ctx.settings.exchange.batch_size:
        return ctx.now_ms()  # a full batch: more are waiting
    async with ctx.store.read() as conn:
        oldest = await data.oldest_removable_finish(conn)
    if oldest is None:
        return None
    due = oldest + retention
    if due <= ctx.now_ms() and not removed:
        # Due but not ours to take (another server holds it): coming back at once would only spin.
        return None
    return due


async def retention_loop(ctx: Context) -> None:
    """Remove finished processes as they fall due; with retention 0, as soon as each one's cleanup is over."""
    retention = ctx.settings.exchange.finished_retention_ms
    if retention is None:
        return
    channel = FINISHED_CHANNEL if retention == 0 else RETENTION_CHANNEL
    await run_loop(ctx, "exchange-retention", lambda: retention_step(ctx), channel=channel,
                   poll_ms=ctx.settings.exchange.retention_interval_ms)
