"""The processing protocol: API_2 start, heartbeat, API_3 ready, API_4 committed, API_5 commit-failed,
the administrator's resolve, and inspecting processes.

Every transition is one store transaction that locks the process row and checks its state, so a late
call, the watchdog and another server can race without two of them applying. The transaction records
where each message file must go; the files follow after commit (``sync``), re-runnably.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import TypedDict

from mainspring.core import outbox
from mainspring.core.alerts import raise_alert
from mainspring.core.errors import MainspringError
from mainspring.core.paging import encode_cursor, time_key_cursor
from mainspring.core.runtime import Context
from mainspring.exchange import data, files, sync
from mainspring.exchange.data import NewMessage, ProcessRow
from mainspring.exchange.errors import (
    AlreadyCommitted,
    Busy,
    Cancelled,
    MessageIdConflict,
    MessagesUnavailable,
    NotInDoubt,
    ProcessNotFound,
    TooLarge,
)
from mainspring.exchange.messages import (
    CHANNEL,
    FINISHED_CHANNEL,
    discard_body,
    new_id,
    write_body,
)
from mainspring.exchange.models import Reply
from mainspring.store import Transaction, format_time
from mainspring.types import JsonInput

log = logging.getLogger("mainspring.exchange")

SUBJECT = "exchange.process"
class ProcessView(TypedDict):
    """An exchange process as the API shows it."""

    id: str
    addressee: str
    database: str
    client_id: str
    message_ids: list[str]
    state: str
    started_at: str | None
    deadline: str | None
    updated_at: str | None
    error: str | None


class ProcessPage(TypedDict):
    processes: list[ProcessView]
    next_cursor: str | None


def process_to_api(row: ProcessRow) -> ProcessView:
    return {
        "id": row.id,
        "addressee": row.addressee,
        "database": row.database,
        "client_id": row.client_id,
        "message_ids": list(row.message_ids),
        "state": row.state,
        "started_at": format_time(row.started_at),
        "deadline": format_time(row.deadline),
        "updated_at": format_time(row.updated_at),
        "error": row.error,
    }


async def _event(tx: Transaction, kind: str, row: ProcessRow, **fields: JsonInput) -> None:
    await outbox.emit(
        tx, f"exchange.process.{kind}", SUBJECT, row.id,
        {"addressee": row.addressee, "database": row.database, "state": fields.pop("state", row.state), **fields},
    )


async def get_process(ctx: Context, process_id: str) -> ProcessView:
    async with ctx.store.read() as conn:
        row = await data.get_process(conn, process_id)
    if row is None:
        raise ProcessNotFound(f"no process {process_id}")
    return process_to_api(row)


async def list_processes(
    ctx: Context, *, state: str | None, addressee: str | None, database: str | None, limit: int, cursor: str | None
) -> ProcessPage:
    after = time_key_cursor(cursor) if cursor else None
    async with ctx.store.read() as conn:
        rows = await data.list_processes(
            conn, state=state, addressee=addressee, database=database, limit=limit + 1, after=after
        )
    next_cursor = encode_cursor(rows[limit - 1].started_at, rows[limit - 1].id) if len(rows) > limit else None
    return {"processes": [process_to_api(r) for r in rows[:limit]], "next_cursor": next_cursor}


async def start_process(
    ctx: Context, addressee: str, database: str, client_id: str, message_ids: list[str]
) -> ProcessView:
    """API_2: take all of ``message_ids`` for one new process, or none of them."""
    ids = list(dict.fromkeys(message_ids))
    store = ctx.store
    now = store.now_ms()
    process_id = new_id("p", now)
    try:
        async with store.transaction() as tx:
            active = await data.active_process_id(tx, addressee, database)
            if active is not None:
                raise Busy(f"process {active} holds this mailbox", active_process_id=active)
            rows = await data.message_states(tx, ids)
            unavailable = [
                i for i in ids
                if i not in rows
                or (rows[i].addressee, rows[i].database) != (addressee, database)
                or rows[i].state != "AVAILABLE"
            ]
            if unavailable:
                raise MessagesUnavailable(
                    f"{len(unavailable)} of the messages cannot be processed", message_ids=unavailable
                )
            # The partial unique index on active processes decides between concurrent starts.
            deadline = now + ctx.settings.exchange.process_timeout_ms
            await data.insert_process(tx, process_id, addressee, database, client_id, ids, now=now, deadline=deadline)
            if await data.take_mailbox_messages(tx, ids, process_id) != len(ids):
                raise MessagesUnavailable("some messages were taken meanwhile", message_ids=ids)
            # The row as just inserted (not read back: a statement less on every start).
            row = ProcessRow(id=process_id, addressee=addressee, database=database, client_id=client_id,
                             message_ids=ids, state="STARTED", started_at=now, deadline=deadline, updated_at=now,
                             error=None, cleanup_attempts=0, next_attempt_at=None)
            await _event(tx, "started", row, client_id=client_id, message_ids=ids)
    except MainspringError:
        raise
    except Exception as exc:
        if not store.dialect.is_unique_violation(exc):
            raise
        async with store.read() as conn:
            active = await data.active_process_id(conn, addressee, database)
        raise Busy(f"process {active} holds this mailbox", active_process_id=active) from None
    return process_to_api(row)


async def heartbeat(ctx: Context, process_id: str) -> ProcessView:
    """Push the deadline of a live process forward; anything else is answered ``cancelled``."""
    settings = ctx.settings.exchange
    async with ctx.store.transaction() as tx:
        row = await data.lock_process(tx, process_id)
        if row is None:
            raise Cancelled(f"no process {process_id}")
        now = ctx.store.now_ms()
        if row.state == "STARTED":
            deadline = now + settings.process_timeout_ms
        elif row.state == "READY_TO_COMMIT":
            deadline = now + settings.commit_timeout_ms
        else:
            raise Cancelled(f"process {process_id} is {row.state}", state=row.state)
        await data.extend_deadline(tx, process_id, deadline, now)
        row = await data.reload_process(tx, process_id)
    return process_to_api(row)


async def ready(ctx: Context, process_id: str, replies: list[Reply]) -> ProcessView:
    """API_3: STARTED → READY_TO_COMMIT, storing the replies unpublished. Again OK when already there."""
    store = ctx.store
    sender: str | None = None
    if replies:
        # A first look before the reply files are written: none is written for a process that cannot take them.
        # Without replies the transaction below looks, and answers, the same (a read less on every such API_3).
        async with store.read() as conn:
            row = await data.get_process(conn, process_id)
        if row is None or row.state not in ("STARTED", "READY_TO_COMMIT"):
            raise _not_ready(process_id, row)
        if row.state == "READY_TO_COMMIT":
            return process_to_api(row)
        sender = row.client_id
    limit = ctx.settings.exchange.max_message_bytes
    now = store.now_ms()
    prepared: list[tuple[Reply, NewMessage]] = []
    written: list[str] = []
    try:
        for reply in replies:
            body = reply.data()
            if len(body) > limit:
                raise TooLarge(f"a reply is over {limit} bytes")
            reply_id = new_id("m", now)
            relative = files.mailbox_path(reply.addressee, reply.database, reply_id)
            await write_body(ctx, relative, body)
            written.append(relative)
            prepared.append((reply, NewMessage(
                id=reply_id, addressee=reply.addressee, database=reply.database, message_key=reply.message_id,
                size=len(body), sha256=hashlib.sha256(body).hexdigest(), content_type=reply.media_type(),
                sender=sender, created_at=now, state="PENDING", path=relative, origin_process_id=process_id,
            )))
        outcome: MainspringError | None = None
        async with store.transaction() as tx:
            row = await data.lock_process(tx, process_id)
            if row is None or row.state not in ("STARTED", "READY_TO_COMMIT"):
                outcome = _not_ready(process_id, row)
            elif row.state == "STARTED":
                keys: set[tuple[str, str, str]] = set()
                fresh: list[NewMessage] = []
                for reply, values in prepared:
                    if reply.message_id is not None:
                        key = (reply.addressee, reply.database, reply.message_id)
                        existing = await data.message_by_key(tx, reply.addressee, reply.database, reply.message_id)
                        if existing is not None and existing.sha256 != values.sha256:
                            raise MessageIdConflict(
                                f"reply Message-Id {reply.message_id!r} is already stored with other bytes"
                            )
                        if existing is not None or key in keys:
                            continue
                        keys.add(key)
                    fresh.append(values)
                if fresh:
                    await data.insert_messages(tx, fresh)
                kept = {v.path for v in fresh}
                written = [w for w in written if w not in kept]
                deadline = now + ctx.settings.exchange.commit_timeout_ms
                await data.mark_process_ready(tx, process_id, deadline, now)
                # The locked row with what was just written (not read back: a statement less on every API_3).
                row = dataclasses.replace(row, state="READY_TO_COMMIT", deadline=deadline, updated_at=now)
                await _event(tx, "ready", row, reply_ids=[v.id for v in fresh])
                tx.notify(CHANNEL)
        if outcome is not None:
            raise outcome
        assert row is not None  # a process that is gone set ``outcome``
        return process_to_api(row)
    finally:
        # Files of replies that did not make it into the store (refused, raced, duplicates).
        for relative in written:
            await discard_body(ctx, relative)


def _not_ready(process_id: str, row: ProcessRow | None) -> Cancelled:
    """API_3's answer for a process that is not STARTED (nor READY_TO_COMMIT already)."""
    if row is None:
        return Cancelled(f"no process {process_id}")
    return Cancelled(f"process {process_id} is {row.state}", state=row.state)


async def _alert(tx: Transaction, code: str, process_id: str, detail: str) -> None:
    await raise_alert(tx, code, SUBJECT, process_id, detail)


async def committed(
    ctx: Context, process_id: str, *, resolving: bool = False
) -> ProcessView:
    """API_4: the client's database committed. READY_TO_COMMIT or IN_DOUBT → CLEANUP (the replies visible in
    the same step) → DONE once its files are deleted (or moved to ``backup/``), and answered then (API.md:
    repeats answer the same). A disk that refuses leaves CLEANUP, retried by the watchdog; a server that dies
    in between leaves CLEANUP for any watchdog or the next start-up, which know from the store where each
    file must go."""
    store = ctx.store
    backup = ctx.settings.exchange.backup
    outcome: MainspringError | None = None
    to_clean: list[data.MessageRow] | None = None
    async with store.transaction() as tx:
        row = await data.lock_process(tx, process_id)
        if row is None:
            if resolving:
                raise ProcessNotFound(f"no process {process_id}")
            await _alert(tx, "exchange_commit_not_allowed", process_id,
                         f"a client reported committing unknown process {process_id}")
            outcome = Cancelled(f"no process {process_id}")
        else:
            if resolving and row.state != "IN_DOUBT":
                raise NotInDoubt(f"process {process_id} is {row.state}", state=row.state)
            if row.state in ("READY_TO_COMMIT", "IN_DOUBT"):
                to_clean = await _commit(tx, row, backup, resolving)
            elif row.state not in ("CLEANUP", "DONE"):
                await _alert(tx, "exchange_commit_not_allowed", process_id,
                             f"client {row.client_id} committed process {process_id} while it was {row.state}; "
                             "its messages may be processed twice")
                outcome = Cancelled(f"process {process_id} was never allowed to commit ({row.state})",
                                    state=row.state)
    if outcome is not None:
        raise outcome
    assert row is not None  # a process that is gone set ``outcome``
    if to_clean is not None:
        # This call committed: its files are the rows it just wrote (not read again), and the transaction
        # that records their deletion answers the process DONE (not read again either).
        done = await sync.clean_up_committed(ctx, process_id, to_clean)
        if done is not None:
            return process_to_api(done)
    else:
        # A repeat (CLEANUP or DONE already): finish what is left, as the first call would have.
        await sync.sync_process_files(ctx, process_id)
    async with store.read() as conn:
        now_row = await data.get_process(conn, process_id)
    if now_row is None:
        # Only retention removes a process, and only a finished one: the cleanup ended (DONE) and, with
        # ``finished_retention_ms = 0``, the loop woken by it removed the row before this read. The answer is
        # still the process as this call left it, never 404.
        now_row = dataclasses.replace(row, state="DONE", deadline=None, updated_at=store.now_ms())
    return process_to_api(now_row)


async def _commit(tx: Transaction, row: ProcessRow, backup: bool, resolving: bool) -> list[data.MessageRow]:
    """READY_TO_COMMIT or IN_DOUBT → CLEANUP; answers the committed messages, their file moves due."""
    now = tx.store.now_ms()
    replies, committed_rows = await data.commit_process_messages(tx, row.id, backup, now)
    await data.mark_process_committed(tx, row.id, now)
    await _event(tx, "committed", row, state="CLEANUP", previous=row.state)
    tx.after_commit(lambda: log.info("process %s of %s/%s committed (was %s); cleaning up",
                                     row.id, row.addressee, row.database, row.state))
    if resolving:
        await _event(tx, "resolved", row, state="CLEANUP", committed=True)
    await outbox.emit_many(tx, [
        outbox.Event("exchange.message.stored", "exchange.message", r.id,
                     {"addressee": r.addressee, "database": r.database, "size": r.size, "sha256": r.sha256,
                      "process_id": row.id})
        for r in replies
    ])
    tx.notify(CHANNEL)
    return committed_rows


async def commit_failed(
    ctx: Context, process_id: str, error: str | None, *, resolving: bool = False
) -> ProcessView:
    """API_5: the client's database did not commit. → ABORTED, messages available again, replies dropped."""
    outcome: MainspringError | None = None
    async with ctx.store.transaction() as tx:
        row = await data.lock_process(tx, process_id)
        if row is None:
            raise ProcessNotFound(f"no process {process_id}")
        if resolving and row.state != "IN_DOUBT":
            raise NotInDoubt(f"process {process_id} is {row.state}", state=row.state)
        if row.state in ("STARTED", "READY_TO_COMMIT", "IN_DOUBT"):
            row = await abort(tx, row, error, resolving=resolving)
        elif row.state in ("CLEANUP", "DONE"):
            await _alert(tx, "exchange_commit_contradiction", process_id,
                         f"client {row.client_id} reported a failed commit of process {process_id}, "
                         "which was already reported committed")
            outcome = AlreadyCommitted(f"process {process_id} is {row.state}", state=row.state)
    if outcome is not None:
        raise outcome
    await sync.sync_process_files(ctx, process_id)
    # The process as this transaction left it, not read back: ABORTED never changes again, and with
    # ``finished_retention_ms = 0`` the retention loop (woken at this commit) may already have removed it.
    return process_to_api(row)


async def abort(tx: Transaction, row: ProcessRow, error: str | None, *, resolving: bool = False,
                state: str = "ABORTED") -> ProcessRow:
    """Give a process's messages back to its mailbox (from ``unknown/`` if quarantined) and drop its
    replies; used by API_5 and by the watchdog's cancel. Answers the process as it now is."""
    now = tx.store.now_ms()
    await data.give_back_messages(tx, row.id, now)
    await data.end_process(tx, row.id, state, error, now)
    await _event(tx, state.lower(), row, state=state, previous=row.state, error=error)
    tx.after_commit(lambda: log.info("process %s of %s/%s %s (was %s): %s", row.id, row.addressee,
                                     row.database, state, row.state, error or "no reason given"))
    if resolving:
        await _event(tx, "resolved", row, state=state, committed=False)
    tx.notify(CHANNEL)
    if state == "ABORTED":
        tx.notify(FINISHED_CHANNEL)
    return dataclasses.replace(row, state=state, deadline=None, updated_at=now, error=error)


async def resolve(ctx: Context, process_id: str, was_committed: bool) -> ProcessView:
    """The administrator's answer for an IN_DOUBT process, applied as API_4 or API_5 would."""
    if was_committed:
        return await committed(ctx, process_id, resolving=True)
    return await commit_failed(ctx, process_id, "resolved by an administrator", resolving=True)


# --- what the dashboard shows beside the API ----------------------------------------------------------


async def held_messages(ctx: Context, process_ids: list[str]) -> dict[str, list[dict[str, str | int | None]]]:
    """Process id → the messages it took, oldest first, and where their files are now (an IN_DOUBT
    process's wait in ``unknown/``)."""
    if not process_ids:
        return {}
    found: dict[str, list[dict[str, str | int | None]]] = {pid: [] for pid in process_ids}
    async with ctx.store.read() as conn:
        for row in await data.messages_of_processes(conn, process_ids):
            found[str(row.process_id)].append(
                {"id": row.id, "state": row.state, "path": row.path, "size": row.size, "sha256": row.sha256}
            )
    return found


async def failing_file_moves(ctx: Context, limit: int = 50) -> list[dict[str, str | int | None]]:
    """Message files whose move or delete keeps failing (the watchdog retries them), next retry first."""
    async with ctx.store.read() as conn:
        rows = await data.failing_file_moves(conn, limit)
    return [
        {
            "id": r.id, "mailbox": f"{r.addressee}/{r.database}", "process_id": r.process_id or r.origin_process_id,
            "state": r.state, "attempts": r.sync_attempts, "error": r.sync_error, "next_at": format_time(r.next_sync_at),
        }
        for r in rows
    ]


# --- the dashboard --------------------------------------------------------------------------------------


async def count_by_state(ctx: Context) -> dict[str, dict[str, int]]:
    """Processes and messages counted by state."""
    async with ctx.store.read() as conn:
        return await data.count_by_state(conn)


async def mean_cycle_by_bucket(ctx: Context, since: int, until: int, bucket_ms: int) -> dict[int, float]:
    """Mean time from started to DONE (ms) of the processes done in each ``bucket_ms`` after ``since``."""
    async with ctx.store.read() as conn:
        return await data.mean_cycle_by_bucket(conn, ctx.store, since, until, bucket_ms)
