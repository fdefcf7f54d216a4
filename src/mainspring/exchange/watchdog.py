"""The watchdog loop and start-up recovery.

Watchdog: STARTED past its deadline → CANCELLED (messages available again); READY_TO_COMMIT past its
commit deadline → IN_DOUBT (files to ``unknown/<process_id>/``, an alert); pending file moves retried.
Start-up: CANCELLED dropped, CLEANUP finished, READY_TO_COMMIT → IN_DOUBT, STARTED keep their deadline.
Each step is a bounded batch and may be interrupted anywhere: running it again ends the same way.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import delete, func, literal, select, update

from mainspring.core import outbox
from mainspring.core.alerts import raise_alerts
from mainspring.core.runtime import Context, run_loop
from mainspring.exchange import sync
from mainspring.exchange.service import SUBJECT, abort
from mainspring.exchange.tables import ACTIVE_STATES
from mainspring.exchange.tables import exchange_messages as M
from mainspring.exchange.tables import exchange_processes as P

log = logging.getLogger("mainspring.exchange")

WATCHDOG_CHANNEL = "exchange:watchdog"


async def cancel_expired(ctx: Context) -> int:
    """STARTED processes past their deadline → CANCELLED; answers how many."""
    store = ctx.store
    async with store.transaction() as tx:
        now = store.now_ms()
        query = (
            select(P).where(P.c.state == "STARTED", P.c.deadline <= now)
            .order_by(P.c.deadline).limit(ctx.settings.exchange.batch_size)
        )
        rows = (await tx.execute(store.dialect.skip_locked(query))).all()
        for row in rows:
            log.info("process %s of %s/%s passed its deadline: CANCELLED", row.id, row.addressee, row.database)
            await abort(tx, row, "the process deadline passed without API_3", state="CANCELLED")
    return len(rows)


async def doubt_ready(ctx: Context, *, expired_only: bool = True) -> int:
    """READY_TO_COMMIT processes (past their commit deadline, or all at start-up) → IN_DOUBT."""
    store = ctx.store
    async with store.transaction() as tx:
        now = store.now_ms()
        query = select(P).where(P.c.state == "READY_TO_COMMIT").order_by(P.c.id).limit(ctx.settings.exchange.batch_size)
        if expired_only:
            query = query.where(P.c.deadline <= now)
        rows = (await tx.execute(store.dialect.skip_locked(query))).all()
        if not rows:
            return 0
        ids = [r.id for r in rows]
        await tx.execute(
            update(M)
            .where(M.c.process_id.in_(ids), M.c.state == "TAKEN")
            .values(state="QUARANTINED", prev_path=M.c.path,
                    path=literal("unknown/") + M.c.process_id + "/" + M.c.id,
                    file_version=M.c.file_version + 1, synced=False, next_sync_at=now, sync_attempts=0)
        )
        await tx.execute(update(P).where(P.c.id.in_(ids)).values(state="IN_DOUBT", deadline=None, updated_at=now))
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
        deadline = (
            await conn.execute(select(func.min(P.c.deadline)).where(P.c.state.in_(ACTIVE_STATES)))
        ).scalar()
        files_due = await sync.next_sync_due(conn)
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
        result = await tx.execute(delete(P).where(P.c.state == "CANCELLED"))
    return int(result.rowcount or 0)


async def finish_all_cleanups(ctx: Context) -> int:
    total = 0
    after = ""
    while True:
        async with ctx.store.transaction() as tx:
            ids = list((await tx.execute(
                select(P.c.id).where(P.c.state == "CLEANUP", P.c.id > after).order_by(P.c.id)
                .limit(ctx.settings.exchange.batch_size)
            )).scalars())
            if not ids:
                return total
            total += await sync.finish_cleanups(tx, ids)
        after = ids[-1]


async def recover(ctx: Context) -> None:
    """Start-up recovery, as API.md says; safe to run again after a crash half-way."""
    started = time.monotonic()
    dropped = await drop_cancelled(ctx)
    doubted = await _drain(doubt_ready, ctx, expired_only=False)
    moved = await sync.sync_all_once(ctx)
    done = await finish_all_cleanups(ctx)
    log.info(
        "exchange recovery: %d cancelled dropped, %d ready-to-commit now in doubt, %d file moves, "
        "%d cleanups finished in %.2fs", dropped, doubted, moved, done, time.monotonic() - started,
    )
