"""Making the disk follow the store: message file moves and deletes, and finishing CLEANUP.

A transition records where each file must be (``path``; NULL: deleted) and bumps ``file_version``; this
module does the move, then marks the row ``synced`` only if no newer decision came meanwhile. A move that
fails is logged and retried with a doubling delay; a process stays in CLEANUP until every file of its
committed messages is gone (or in ``backup/``), and raises an alert once that keeps failing.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mainspring.core import outbox
from mainspring.core.alerts import raise_alert
from mainspring.core.runtime import Context, log_failure
from mainspring.exchange import data, files
from mainspring.exchange.data import MessageRow
from mainspring.exchange.messages import FINISHED_CHANNEL, disk_of, file_candidates
from mainspring.store import Transaction

log = logging.getLogger("mainspring.exchange")

FILE_THREADS = 8


@dataclass
class Outcome:
    row: MessageRow
    done: bool
    missing: bool = False
    error: str | None = None


def _apply(disk: files.Disk, row: MessageRow) -> Outcome:
    candidates = [c for c in file_candidates(row) if c != row.path]
    try:
        if row.path is None:
            disk.remove(candidates)
            return Outcome(row, True)
        if disk.place(row.path, candidates):
            return Outcome(row, True)
        return Outcome(row, True, missing=True)
    except OSError as exc:
        return Outcome(row, False, error=f"{type(exc).__name__}: {exc}")


def _apply_all(disk: files.Disk, rows: list[MessageRow]) -> list[Outcome]:
    """Apply a batch, its folder fsyncs deferred to the end of the whole batch (a large one's made durable
    by one ``syncfs``). File calls wait on the disk, not the CPU, so a large batch runs on a few threads: on a
    disk mounted with ``discard`` an unlink waits ~1 ms, and eight at once take little longer than one."""
    outcomes: list[Outcome] = []
    try:
        with disk.deferred_fsync() as pending:
            if len(rows) < 32:
                outcomes = [_apply(disk, row) for row in rows]
            else:
                step = -(-len(rows) // FILE_THREADS)
                chunks = [rows[i:i + step] for i in range(0, len(rows), step)]
                with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
                    outcomes = [o for part in pool.map(lambda chunk: _apply_chunk(disk, chunk, pending), chunks)
                                for o in part]
    except OSError as exc:
        # The moves may not be durable: none counts as done; they are re-run (idempotently) later.
        error = f"fsync: {type(exc).__name__}: {exc}"
        return [Outcome(o.row, False, error=o.error or error) for o in outcomes] or [
            Outcome(row, False, error=error) for row in rows]
    return outcomes


def _apply_chunk(disk: files.Disk, rows: list[MessageRow], pending: set[Path]) -> list[Outcome]:
    with disk.deferring_into(pending):
        return [_apply(disk, row) for row in rows]


def retry_delay(ctx: Context, attempts: int) -> int:
    settings = ctx.settings.exchange
    return int(min(settings.cleanup_retry_max_ms, settings.cleanup_retry_ms * 2 ** min(attempts, 30)))


async def sync_files(ctx: Context, *, process_id: str | None = None) -> int:
    """Do one batch of the file moves that are due; answers how many rows it handled."""
    store = ctx.store
    now = store.now_ms()
    async with store.read() as conn:
        rows = await data.due_file_moves(conn, now, ctx.settings.exchange.batch_size, process_id)
    if not rows:
        if process_id is not None:
            async with store.transaction() as tx:
                await finish_cleanups(tx, [process_id])
        return 0
    await _sync_rows(ctx, rows, now)
    return len(rows)


async def sync_all_once(ctx: Context, due_by: int | None = None) -> int:
    """Try every pending file move once, due or not (start-up: the disk may be back), or only those due by
    ``due_by``. The disk work of one batch runs while the store records the one before (one at a time, in id
    order), so start-up recovery waits on the slower of the two, not on both."""
    store = ctx.store
    after = ""
    total = 0
    recording: asyncio.Task[None] | None = None
    try:
        while True:
            async with store.read() as conn:
                rows = await data.pending_file_moves(conn, after, ctx.settings.exchange.batch_size, due_by)
            if not rows:
                return total
            attempted_at = store.now_ms()
            outcomes = await asyncio.to_thread(_apply_all, disk_of(ctx), rows)
            if recording is not None:
                await recording
            recording = asyncio.ensure_future(_record(ctx, outcomes, attempted_at))
            total += len(rows)
            after = rows[-1].id
    finally:
        if recording is not None:
            await recording


async def _sync_rows(ctx: Context, rows: list[MessageRow], attempted_at: int) -> None:
    await _record(ctx, await asyncio.to_thread(_apply_all, disk_of(ctx), rows), attempted_at)


async def _record(ctx: Context, outcomes: list[Outcome], attempted_at: int) -> None:
    async with ctx.store.transaction() as tx:
        await record_file_moves(ctx, tx, outcomes, attempted_at)


async def record_file_moves(
    ctx: Context, tx: Transaction, outcomes: list[Outcome], attempted_at: int
) -> list[data.ProcessRow]:
    """Record a batch of moves tried at ``attempted_at``: a failed one is retried a delay after that attempt
    (not after this record, which may come much later: the disk may have healed meanwhile). Answers the
    processes whose cleanup this ended (now DONE)."""
    # Rows are locked in id order, then processes in id order, whoever records: recovery, the watchdog and
    # a process's own cleanup (on any server) may record overlapping rows at once and must not deadlock.
    outcomes = sorted(outcomes, key=lambda o: o.row.id)
    now = tx.store.now_ms()
    alert_after = ctx.settings.exchange.cleanup_alert_after
    cleanup_pids: set[str] = set()
    failed_pids: dict[str, str] = {}
    synced = [(o.row.id, o.row.file_version, "file missing" if o.missing else None) for o in outcomes if o.done]
    if synced:
        await data.mark_files_synced(tx, synced)
        # The last move of an ABORTED process may be among them: it can be removed now.
        tx.notify(FINISHED_CHANNEL)
    for outcome in outcomes:
        row = outcome.row
        if row.state == "COMMITTED" and row.process_id:
            cleanup_pids.add(row.process_id)
        if outcome.done:
            if outcome.missing and row.state != "COMMITTED" and await _decision_stands(tx, row):
                await raise_alert(tx, "exchange_message_file_missing", "exchange.message", row.id,
                                  f"the file of message {row.id} was not found anywhere under the exchange folder")
            continue
        attempts = row.sync_attempts + 1
        log.warning("moving the file of message %s to %s failed (attempt %d): %s",
                    row.id, row.path or "deletion", attempts, outcome.error)
        await data.postpone_file_move(tx, row, attempts, attempted_at + retry_delay(ctx, attempts - 1), outcome.error)
        if row.state == "COMMITTED" and row.process_id:
            failed_pids[row.process_id] = outcome.error or "error"
        elif attempts >= alert_after:
            await raise_alert(tx, "exchange_file_move_failing", "exchange.message", row.id,
                              f"moving the file of message {row.id} has failed {attempts} times: {outcome.error}")
    for pid, error in sorted(failed_pids.items()):
        # Only while it is cleaning up: a failure another server's round met on a disk that has since healed
        # must not touch a process that finished meanwhile (its updated_at is when it finished: retention).
        failed_before = await data.cleanup_attempts(tx, pid)
        if failed_before is None:
            continue
        attempts = failed_before + 1
        await data.postpone_cleanup(tx, pid, attempts, attempted_at + retry_delay(ctx, attempts - 1), now)
        if attempts >= alert_after:
            await raise_alert(tx, "exchange_cleanup_failing", "exchange.process", pid,
                              f"cleanup of process {pid} has failed {attempts} times: {error}")
    return await _finish(tx, sorted(cleanup_pids - set(failed_pids)))


async def _decision_stands(tx: Transaction, row: MessageRow) -> bool:
    """Whether the move ``row`` asked for is still the latest decision about its file: a newer one (another
    server's, recorded meanwhile) may have moved the file away while we looked, so a miss proves nothing."""
    return await data.file_version_of(tx, row.id) == row.file_version


async def finish_cleanups(tx: Transaction, process_ids: list[str]) -> int:
    """CLEANUP → DONE for those of ``process_ids`` whose committed message files are all gone; answers how
    many."""
    return len(await _finish(tx, process_ids))


async def _finish(tx: Transaction, process_ids: list[str]) -> list[data.ProcessRow]:
    if not process_ids:
        return []
    rows = await data.mark_cleanups_done(tx, process_ids)
    if not rows:
        return []
    await outbox.emit_many(tx, [
        outbox.Event("exchange.process.done", "exchange.process", r.id,
                     {"addressee": r.addressee, "database": r.database, "state": "DONE"})
        for r in rows
    ])
    tx.notify(FINISHED_CHANNEL)
    return rows


async def sync_process_files(ctx: Context, process_id: str) -> None:
    """Right after API_4/API_5: do this process's file moves now; a failure is left to the watchdog."""
    try:
        while await sync_files(ctx, process_id=process_id) >= ctx.settings.exchange.batch_size:
            pass
    except Exception as exc:
        log_failure(log, exc, "file moves of process %s failed; the watchdog retries them", process_id)


async def clean_up_committed(ctx: Context, process_id: str, rows: list[MessageRow]) -> data.ProcessRow | None:
    """Right after API_4's commit: delete (or back up) the files of ``rows``, the messages that commit just
    wrote, without reading them again; answers the process if this ended its cleanup (DONE). A failure, or a
    file left to move, is left to the watchdog (the rows stay due) and answers None."""
    try:
        attempted_at = ctx.store.now_ms()
        outcomes = await asyncio.to_thread(_apply_all, disk_of(ctx), rows)
        async with ctx.store.transaction() as tx:
            if not outcomes:
                finished = await _finish(tx, [process_id])
            else:
                finished = await record_file_moves(ctx, tx, outcomes, attempted_at)
    except Exception as exc:
        log_failure(log, exc, "file moves of process %s failed; the watchdog retries them", process_id)
        return None
    return next((row for row in finished if row.id == process_id), None)
