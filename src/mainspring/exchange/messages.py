"""Messages: storing them (idempotent by Message-Id), listing what is available (API_1), reading one."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import secrets
from typing import TypedDict

from mainspring.core import outbox
from mainspring.core.errors import InvalidRequest
from mainspring.core.paging import encode_cursor, time_key_cursor
from mainspring.core.runtime import Context
from mainspring.core.types import check_media_type
from mainspring.exchange import data, files
from mainspring.exchange.data import MessageRow, NewMessage
from mainspring.exchange.errors import (
    MessageIdConflict,
    MessageNotFound,
    StorageUnavailable,
    TooLarge,
)
from mainspring.store import Transaction, format_time

log = logging.getLogger("mainspring.exchange")

CHANNEL = "exchange"
FINISHED_CHANNEL = "exchange:finished"
"""Notified when a process finishes (DONE, ABORTED) or file moves are recorded: with
``finished_retention_ms = 0`` the retention loop removes such processes at once."""
WATCHDOG_CHANNEL = "exchange:watchdog"
"""Wakes this server's watchdog: deadlines to enforce, or file moves due now."""
READABLE_STATES = ("AVAILABLE", "TAKEN", "QUARANTINED")


_sequence = itertools.count()


def new_id(prefix: str, now_ms: int) -> str:
    """An id that sorts by creation time (and within a millisecond by creation order on this server)
    and never repeats."""
    return f"{prefix}{now_ms:012x}{next(_sequence) % 0x1000000:06x}{secrets.token_hex(6)}"


def disk_of(ctx: Context) -> files.Disk:
    disk = ctx.extras.get("exchange.disk")
    if disk is None:
        disk = ctx.extras["exchange.disk"] = files.Disk(ctx.settings.server.data_dir / "exchange")
    return disk  # type: ignore[no-any-return]


class MessageView(TypedDict):
    """A message as the API shows it."""

    id: str
    addressee: str
    database: str
    size: int
    sha256: str
    content_type: str
    sender: str | None
    created_at: str | None


class MessagePage(TypedDict):
    messages: list[MessageView]
    busy: bool
    active_process_id: str | None
    next_cursor: str | None


class MailboxView(TypedDict):
    addressee: str
    database: str
    available: int
    active_process_id: str | None


def message_to_api(row: MessageRow | NewMessage) -> MessageView:
    return {
        "id": row.id,
        "addressee": row.addressee,
        "database": row.database,
        "size": row.size,
        "sha256": row.sha256,
        "content_type": row.content_type,
        "sender": row.sender,
        "created_at": format_time(row.created_at),
    }


def file_candidates(row: MessageRow) -> list[str | None]:
    """Every place the file of ``row`` may be while its last recorded move is not yet done."""
    places: list[str | None] = [row.path, row.prev_path, files.mailbox_path(row.addressee, row.database, row.id)]
    if row.process_id:
        places.append(files.unknown_path(row.process_id, row.id))
    return places


async def write_body(ctx: Context, relative: str, data: bytes) -> None:
    """Write a message file atomically; a refusing disk is answered 503 and leaves nothing behind."""
    try:
        await asyncio.to_thread(disk_of(ctx).write_atomic, relative, data)
    except OSError as exc:
        log.error("cannot write message file %s: %s", relative, exc)
        raise StorageUnavailable(f"the message file could not be written ({exc.strerror or exc})") from exc


async def discard_body(ctx: Context, relative: str) -> None:
    await asyncio.to_thread(disk_of(ctx).discard, relative)


async def _by_key(ctx: Context, addressee: str, database: str, key: str) -> MessageRow | None:
    async with ctx.store.read() as conn:
        return await data.message_by_key(conn, addressee, database, key)


def _same_or_conflict(existing: MessageRow, digest: str, key: str) -> MessageView:
    if existing.sha256 != digest:
        raise MessageIdConflict(f"Message-Id {key!r} is already stored with other bytes", message_id=existing.id)
    return message_to_api(existing)


def _media_type(content_type: str) -> str:
    """The sender's Content-Type as it will be sent back to whoever reads the message."""
    try:
        if len(content_type) > 255:
            raise ValueError("longer than 255 characters")
        return check_media_type(content_type)
    except ValueError as exc:
        raise InvalidRequest(f"Content-Type: {exc}", errors=[{"loc": ["header", "Content-Type"], "msg": str(exc)}]) from None


async def store_message(
    ctx: Context,
    addressee: str,
    database: str,
    body: bytes,
    *,
    content_type: str | None,
    message_key: str | None,
    sender: str | None,
) -> tuple[MessageView, bool]:
    """Store one message; answers (message, created). A repeated Message-Id with the same bytes is the
    same message, with other bytes a conflict."""
    limit = ctx.settings.exchange.max_message_bytes
    if len(body) > limit:
        raise TooLarge(f"message body over {limit} bytes")
    if not body:
        raise InvalidRequest("a message needs a body", errors=[{"loc": ["body"], "msg": "empty"}])
    if content_type is not None:
        content_type = _media_type(content_type)
    digest = hashlib.sha256(body).hexdigest()
    if message_key is not None:
        existing = await _by_key(ctx, addressee, database, message_key)
        if existing is not None:
            return _same_or_conflict(existing, digest, message_key), False
    store = ctx.store
    now = store.now_ms()
    message_id = new_id("m", now)
    relative = files.mailbox_path(addressee, database, message_id)
    await write_body(ctx, relative, body)
    row = NewMessage(
        id=message_id, addressee=addressee, database=database, message_key=message_key, size=len(body),
        sha256=digest, content_type=content_type or "application/octet-stream", sender=sender, created_at=now,
        state="AVAILABLE", path=relative,
    )
    try:
        # Puts arriving together share one INSERT and one commit (a refused one is replayed alone).
        await store.grouped_batch("exchange.put", _insert_stored, row)
    except Exception as exc:
        await discard_body(ctx, relative)
        if message_key is not None and store.dialect.is_unique_violation(exc):
            existing = await _by_key(ctx, addressee, database, message_key)
            if existing is not None:
                return _same_or_conflict(existing, digest, message_key), False
        raise
    return message_to_api(row), True


async def _insert_stored(tx: Transaction, rows: list[NewMessage]) -> list[None]:
    if tx.store.dialect.one_statement_writes:
        # One statement: the rows, their events and (alone in its commit) the wake-ups to other servers.
        wake = [outbox.SEQUENCER_CHANNEL, CHANNEL]
        await data.insert_stored_with_events(tx, rows, tx.store.now_ms(), wake)
        for channel in wake:
            tx.notify(channel)
        return [None] * len(rows)
    await data.insert_messages(tx, rows)
    await outbox.emit_many(tx, [
        outbox.Event("exchange.message.stored", "exchange.message", row.id,
                     {"addressee": row.addressee, "database": row.database, "size": row.size, "sha256": row.sha256})
        for row in rows
    ])
    tx.notify(CHANNEL)
    return [None] * len(rows)


async def list_available(
    ctx: Context, addressee: str, database: str, *, limit: int, cursor: str | None
) -> MessagePage:
    """API_1: the mailbox's available messages, oldest first, and whether a process holds it."""
    after = time_key_cursor(cursor) if cursor else None
    async with ctx.store.read() as conn:
        rows = await data.available_messages(conn, addressee, database, limit + 1, after)
        active = await data.active_process_id(conn, addressee, database)
    next_cursor = encode_cursor(rows[limit - 1].created_at, rows[limit - 1].id) if len(rows) > limit else None
    return {
        "messages": [message_to_api(r) for r in rows[:limit]],
        "busy": active is not None,
        "active_process_id": active,
        "next_cursor": next_cursor,
    }


async def read_message(ctx: Context, addressee: str, database: str, message_id: str) -> tuple[MessageView, bytes]:
    """One message's bytes while it can still be processed; committed or unpublished ones are not found."""
    async with ctx.store.read() as conn:
        row = await data.mailbox_message(conn, addressee, database, message_id)
    if row is None or row.state not in READABLE_STATES:
        raise MessageNotFound(f"no message {message_id} in this mailbox")
    body = await asyncio.to_thread(disk_of(ctx).read, file_candidates(row))
    if body is None:
        body = await asyncio.to_thread(disk_of(ctx).find_quarantined, row.id)
    if body is None:
        log.error("the file of message %s is missing from %s", message_id, row.path)
        raise MessageNotFound(f"the file of message {message_id} is missing")
    return message_to_api(row), body


class MessageInspected(TypedDict):
    """A message as the dashboard shows it: in whatever state, with where its file is."""

    id: str
    addressee: str
    database: str
    state: str
    size: int
    sha256: str
    content_type: str
    sender: str | None
    path: str | None
    process_id: str | None
    created_at: str | None
    sync_error: str | None


async def inspect_message(ctx: Context, message_id: str) -> MessageInspected | None:
    """One message as the dashboard shows it, in whatever state and mailbox (the API shows only readable
    ones, in their mailbox), with where its file is and why its last move failed."""
    async with ctx.store.read() as conn:
        row = await data.get_message(conn, message_id)
    if row is None:
        return None
    return {
        "id": row.id, "addressee": row.addressee, "database": row.database, "state": row.state, "size": row.size,
        "sha256": row.sha256, "content_type": row.content_type, "sender": row.sender, "path": row.path,
        "process_id": row.process_id, "created_at": format_time(row.created_at), "sync_error": row.sync_error,
    }


async def list_mailboxes(ctx: Context) -> list[MailboxView]:
    """Every mailbox with its count of available messages and its active process."""
    async with ctx.store.read() as conn:
        counts = await data.available_by_mailbox(conn)
        active = await data.active_process_by_mailbox(conn)
    keys = sorted(set(counts) | set(active))
    return [
        {"addressee": a, "database": d, "available": counts.get((a, d), 0), "active_process_id": active.get((a, d))}
        for a, d in keys
    ]
