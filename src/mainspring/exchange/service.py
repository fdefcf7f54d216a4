"""The processing protocol: API_2 start, heartbeat, API_3 ready, API_4 committed, API_5 commit-failed,
the administrator's resolve, and inspecting processes.

Every transition is one store transaction that locks the process row and checks its state, so a late
call, the watchdog and another server can race without two of them applying. The transaction records
where each message file must go; the files follow after commit (``sync``), re-runnably.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import Select, and_, case, literal, select, update

from mainspring.core import outbox
from mainspring.core.alerts import raise_alert
from mainspring.core.errors import MainspringError
from mainspring.core.paging import decode_cursor, encode_cursor
from mainspring.core.runtime import Context
from mainspring.exchange import files, sync
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
    active_process_id,
    discard_body,
    new_id,
    write_body,
)
from mainspring.exchange.models import Reply
from mainspring.exchange.tables import exchange_messages as M
from mainspring.exchange.tables import exchange_processes as P
from mainspring.store import Transaction, format_time

log = logging.getLogger("mainspring.exchange")

SUBJECT = "exchange.process"
Check = Callable[[str], None]


def _allow_all(_addressee: str) -> None:
    return None


def process_to_api(row: Any) -> dict[str, Any]:
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


async def _locked(tx: Transaction, process_id: str) -> Any:
    query: Select[Any] = select(P).where(P.c.id == process_id)
    return (await tx.execute(tx.store.dialect.for_update(query))).first()


async def _reload(tx: Transaction, process_id: str) -> Any:
    return (await tx.execute(select(P).where(P.c.id == process_id))).one()


async def _event(tx: Transaction, kind: str, row: Any, **data: Any) -> None:
    await outbox.emit(
        tx, f"exchange.process.{kind}", SUBJECT, row.id,
        {"addressee": row.addressee, "database": row.database, "state": data.pop("state", row.state), **data},
    )


async def get_process(ctx: Context, process_id: str, check: Check = _allow_all) -> dict[str, Any]:
    async with ctx.store.read() as conn:
        row = (await conn.execute(select(P).where(P.c.id == process_id))).first()
    if row is None:
        raise ProcessNotFound(f"no process {process_id}")
    check(row.addressee)
    return process_to_api(row)


async def list_processes(
    ctx: Context, *, state: str | None, addressee: str | None, database: str | None, limit: int, cursor: str | None
) -> dict[str, Any]:
    query = select(P).order_by(P.c.started_at, P.c.id).limit(limit + 1)
    if state:
        query = query.where(P.c.state == state)
    if addressee:
        query = query.where(P.c.addressee == addressee)
    if database:
        query = query.where(P.c.database == database)
    if cursor:
        at, last = decode_cursor(cursor, 2)
        query = query.where((P.c.started_at > at) | ((P.c.started_at == at) & (P.c.id > last)))
    async with ctx.store.read() as conn:
        rows = (await conn.execute(query)).all()
    next_cursor = encode_cursor(rows[limit - 1].started_at, rows[limit - 1].id) if len(rows) > limit else None
    return {"processes": [process_to_api(r) for r in rows[:limit]], "next_cursor": next_cursor}


async def start_process(
    ctx: Context, addressee: str, database: str, client_id: str, message_ids: list[str]
) -> dict[str, Any]:
    """API_2: take all of ``message_ids`` for one new process, or none of them."""
    ids = list(dict.fromkeys(message_ids))
    store = ctx.store
    now = store.now_ms()
    process_id = new_id("p", now)
    try:
        async with store.transaction() as tx:
            active = await active_process_id(tx, addressee, database)
            if active is not None:
                raise Busy(f"process {active} holds this mailbox", active_process_id=active)
            rows = {
                r.id: r
                for r in (
                    await tx.execute(select(M.c.id, M.c.addressee, M.c.database, M.c.state).where(M.c.id.in_(ids)))
                ).all()
            }
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
            await tx.execute(
                P.insert().values(
                    id=process_id, addressee=addressee, database=database, client_id=client_id,
                    message_ids=ids, state="STARTED", started_at=now,
                    deadline=now + ctx.settings.exchange.process_timeout_ms, updated_at=now,
                )
            )
            taken = await tx.execute(
                update(M)
                .where(M.c.id.in_(ids), M.c.state == "AVAILABLE")
                .values(state="TAKEN", process_id=process_id)
            )
            if taken.rowcount != len(ids):
                raise MessagesUnavailable("some messages were taken meanwhile", message_ids=ids)
            row = await _reload(tx, process_id)
            await _event(tx, "started", row, client_id=client_id, message_ids=ids)
    except MainspringError:
        raise
    except Exception as exc:
        if not store.dialect.is_unique_violation(exc):
            raise
        async with store.read() as conn:
            active = await active_process_id(conn, addressee, database)
        raise Busy(f"process {active} holds this mailbox", active_process_id=active) from None
    return process_to_api(row)


async def heartbeat(ctx: Context, process_id: str, check: Check = _allow_all) -> dict[str, Any]:
    """Push the deadline of a live process forward; anything else is answered ``cancelled``."""
    settings = ctx.settings.exchange
    async with ctx.store.transaction() as tx:
        row = await _locked(tx, process_id)
        if row is None:
            raise Cancelled(f"no process {process_id}")
        check(row.addressee)
        now = ctx.store.now_ms()
        if row.state == "STARTED":
            deadline = now + settings.process_timeout_ms
        elif row.state == "READY_TO_COMMIT":
            deadline = now + settings.commit_timeout_ms
        else:
            raise Cancelled(f"process {process_id} is {row.state}", state=row.state)
        await tx.execute(update(P).where(P.c.id == process_id).values(deadline=deadline, updated_at=now))
        row = await _reload(tx, process_id)
    return process_to_api(row)


async def _existing_reply(tx: Transaction, reply: Reply) -> Any:
    return (
        await tx.execute(
            select(M).where(
                M.c.addressee == reply.addressee, M.c.database == reply.database, M.c.message_key == reply.message_id
            )
        )
    ).first()


async def ready(ctx: Context, process_id: str, replies: list[Reply], check: Check = _allow_all) -> dict[str, Any]:
    """API_3: STARTED → READY_TO_COMMIT, storing the replies unpublished. Again OK when already there."""
    store = ctx.store
    async with store.read() as conn:
        row = (await conn.execute(select(P).where(P.c.id == process_id))).first()
    if row is None:
        raise Cancelled(f"no process {process_id}")
    check(row.addressee)
    if row.state == "READY_TO_COMMIT":
        return process_to_api(row)
    if row.state != "STARTED":
        raise Cancelled(f"process {process_id} is {row.state}", state=row.state)
    limit = ctx.settings.exchange.max_message_bytes
    now = store.now_ms()
    prepared: list[tuple[Reply, dict[str, Any]]] = []
    written: list[str] = []
    try:
        for reply in replies:
            data = reply.data()
            if len(data) > limit:
                raise TooLarge(f"a reply is over {limit} bytes")
            reply_id = new_id("m", now)
            relative = files.mailbox_path(reply.addressee, reply.database, reply_id)
            await write_body(ctx, relative, data)
            written.append(relative)
            prepared.append((reply, {
                "id": reply_id, "addressee": reply.addressee, "database": reply.database,
                "message_key": reply.message_id, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                "content_type": reply.media_type(), "sender": row.client_id, "created_at": now,
                "state": "PENDING", "origin_process_id": process_id, "path": relative, "synced": True,
            }))
        outcome: MainspringError | None = None
        async with store.transaction() as tx:
            row = await _locked(tx, process_id)
            if row is None or row.state not in ("STARTED", "READY_TO_COMMIT"):
                outcome = Cancelled(f"process {process_id} is {row.state if row else 'gone'}")
            elif row.state == "STARTED":
                keys: set[tuple[str, str, str]] = set()
                fresh = []
                for reply, values in prepared:
                    if reply.message_id is not None:
                        key = (reply.addressee, reply.database, reply.message_id)
                        existing = await _existing_reply(tx, reply)
                        if existing is not None and existing.sha256 != values["sha256"]:
                            raise MessageIdConflict(
                                f"reply Message-Id {reply.message_id!r} is already stored with other bytes"
                            )
                        if existing is not None or key in keys:
                            continue
                        keys.add(key)
                    fresh.append(values)
                if fresh:
                    await tx.execute(M.insert(), fresh)
                kept = {v["path"] for v in fresh}
                written = [w for w in written if w not in kept]
                await tx.execute(
                    update(P).where(P.c.id == process_id).values(
                        state="READY_TO_COMMIT", deadline=now + ctx.settings.exchange.commit_timeout_ms,
                        updated_at=now,
                    )
                )
                row = await _reload(tx, process_id)
                await _event(tx, "ready", row, reply_ids=[v["id"] for v in fresh])
                tx.notify(CHANNEL)
        if outcome is not None:
            raise outcome
        return process_to_api(row)
    finally:
        # Files of replies that did not make it into the store (refused, raced, duplicates).
        for relative in written:
            await discard_body(ctx, relative)


async def _alert(tx: Transaction, code: str, process_id: str, detail: str) -> None:
    await raise_alert(tx, code, SUBJECT, process_id, detail)


async def committed(
    ctx: Context, process_id: str, check: Check = _allow_all, *, resolving: bool = False
) -> dict[str, Any]:
    """API_4: the client's database committed. READY_TO_COMMIT or IN_DOUBT → CLEANUP → DONE; the replies
    become visible in the same step. Repeats answer the same."""
    store = ctx.store
    backup = ctx.settings.exchange.backup
    outcome: MainspringError | None = None
    async with store.transaction() as tx:
        row = await _locked(tx, process_id)
        if row is None:
            if resolving:
                raise ProcessNotFound(f"no process {process_id}")
            await _alert(tx, "exchange_commit_not_allowed", process_id,
                         f"a client reported committing unknown process {process_id}")
            outcome = Cancelled(f"no process {process_id}")
        else:
            check(row.addressee)
            if resolving and row.state != "IN_DOUBT":
                raise NotInDoubt(f"process {process_id} is {row.state}", state=row.state)
            if row.state in ("READY_TO_COMMIT", "IN_DOUBT"):
                await _commit(tx, row, backup, resolving)
            elif row.state not in ("CLEANUP", "DONE"):
                await _alert(tx, "exchange_commit_not_allowed", process_id,
                             f"client {row.client_id} committed process {process_id} while it was {row.state}; "
                             "its messages may be processed twice")
                outcome = Cancelled(f"process {process_id} was never allowed to commit ({row.state})",
                                    state=row.state)
    if outcome is not None:
        raise outcome
    await sync.sync_process_files(ctx, process_id)
    return await get_process(ctx, process_id)


async def _commit(tx: Transaction, row: Any, backup: bool, resolving: bool) -> None:
    now = tx.store.now_ms()
    target = (literal("backup/") + M.c.addressee + "/" + M.c.database + "/" + M.c.id) if backup else None
    await tx.execute(
        update(M)
        .where(M.c.process_id == row.id, M.c.state.in_(("TAKEN", "QUARANTINED")))
        .values(state="COMMITTED", prev_path=M.c.path, path=target, file_version=M.c.file_version + 1,
                synced=False, next_sync_at=now, sync_attempts=0)
    )
    replies = (
        await tx.execute(select(M.c.id, M.c.addressee, M.c.database, M.c.size, M.c.sha256)
                         .where(M.c.origin_process_id == row.id, M.c.state == "PENDING"))
    ).all()
    await tx.execute(
        update(M).where(M.c.origin_process_id == row.id, M.c.state == "PENDING").values(state="AVAILABLE")
    )
    await tx.execute(update(P).where(P.c.id == row.id).values(state="CLEANUP", deadline=None, updated_at=now,
                                                               next_attempt_at=now))
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


async def commit_failed(
    ctx: Context, process_id: str, error: str | None, check: Check = _allow_all, *, resolving: bool = False
) -> dict[str, Any]:
    """API_5: the client's database did not commit. → ABORTED, messages available again, replies dropped."""
    outcome: MainspringError | None = None
    async with ctx.store.transaction() as tx:
        row = await _locked(tx, process_id)
        if row is None:
            raise ProcessNotFound(f"no process {process_id}")
        check(row.addressee)
        if resolving and row.state != "IN_DOUBT":
            raise NotInDoubt(f"process {process_id} is {row.state}", state=row.state)
        if row.state in ("STARTED", "READY_TO_COMMIT", "IN_DOUBT"):
            await abort(tx, row, error, resolving=resolving)
        elif row.state in ("CLEANUP", "DONE"):
            await _alert(tx, "exchange_commit_contradiction", process_id,
                         f"client {row.client_id} reported a failed commit of process {process_id}, "
                         "which was already reported committed")
            outcome = AlreadyCommitted(f"process {process_id} is {row.state}", state=row.state)
    if outcome is not None:
        raise outcome
    await sync.sync_process_files(ctx, process_id)
    return await get_process(ctx, process_id)


async def abort(tx: Transaction, row: Any, error: str | None, *, resolving: bool = False,
                state: str = "ABORTED") -> None:
    """Give a process's messages back to its mailbox (from ``unknown/`` if quarantined) and drop its
    replies; used by API_5 and by the watchdog's cancel."""
    now = tx.store.now_ms()
    home = literal("mailboxes/") + M.c.addressee + "/" + M.c.database + "/" + M.c.id
    quarantined = M.c.state == "QUARANTINED"
    await tx.execute(
        update(M)
        .where(M.c.process_id == row.id, M.c.state.in_(("TAKEN", "QUARANTINED")))
        .values(
            state="AVAILABLE",
            prev_path=case((quarantined, M.c.path), else_=M.c.prev_path),
            path=case((quarantined, home), else_=M.c.path),
            file_version=case((quarantined, M.c.file_version + 1), else_=M.c.file_version),
            synced=case((quarantined, False), else_=M.c.synced),
            next_sync_at=case((quarantined, now), else_=M.c.next_sync_at),
        )
    )
    await tx.execute(
        update(M)
        .where(and_(M.c.origin_process_id == row.id, M.c.state == "PENDING"))
        .values(state="DISCARDED", message_key=None, prev_path=M.c.path, path=None,
                file_version=M.c.file_version + 1, synced=False, next_sync_at=now)
    )
    await tx.execute(update(P).where(P.c.id == row.id).values(state=state, deadline=None, updated_at=now,
                                                              error=error))
    await _event(tx, state.lower(), row, state=state, previous=row.state, error=error)
    tx.after_commit(lambda: log.info("process %s of %s/%s %s (was %s): %s", row.id, row.addressee,
                                     row.database, state, row.state, error or "no reason given"))
    if resolving:
        await _event(tx, "resolved", row, state=state, committed=False)
    tx.notify(CHANNEL)
    if state == "ABORTED":
        tx.notify(FINISHED_CHANNEL)


async def resolve(ctx: Context, process_id: str, was_committed: bool) -> dict[str, Any]:
    """The administrator's answer for an IN_DOUBT process, applied as API_4 or API_5 would."""
    if was_committed:
        return await committed(ctx, process_id, resolving=True)
    return await commit_failed(ctx, process_id, "resolved by an administrator", resolving=True)
