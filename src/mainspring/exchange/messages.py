"""Messages: storing them (idempotent by Message-Id), listing what is available (API_1), reading one."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import secrets
from types import SimpleNamespace
from typing import Any

from sqlalchemy import func, select

from mainspring.core import outbox
from mainspring.core.paging import decode_cursor, encode_cursor
from mainspring.core.runtime import Context
from mainspring.exchange import files
from mainspring.exchange.errors import (
    MessageIdConflict,
    MessageNotFound,
    StorageUnavailable,
    TooLarge,
)
from mainspring.exchange.tables import ACTIVE_STATES, exchange_messages, exchange_processes
from mainspring.store import format_time

log = logging.getLogger("mainspring.exchange")

CHANNEL = "exchange"
FINISHED_CHANNEL = "exchange:finished"
"""Notified when a process finishes (DONE, ABORTED) or file moves are recorded: with
``finished_retention_ms = 0`` the retention loop removes such processes at once."""
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


def message_to_api(row: Any) -> dict[str, Any]:
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


def file_candidates(row: Any) -> list[str | None]:
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


async def _by_key(ctx: Context, addressee: str, database: str, key: str) -> Any:
    async with ctx.store.read() as conn:
        return (
            await conn.execute(
                select(exchange_messages).where(
                    exchange_messages.c.addressee == addressee,
                    exchange_messages.c.database == database,
                    exchange_messages.c.message_key == key,
                )
            )
        ).first()


def _same_or_conflict(existing: Any, digest: str, key: str) -> dict[str, Any]:
    if existing.sha256 != digest:
        raise MessageIdConflict(f"Message-Id {key!r} is already stored with other bytes", message_id=existing.id)
    return message_to_api(existing)


async def store_message(
    ctx: Context,
    addressee: str,
    database: str,
    data: bytes,
    *,
    content_type: str | None,
    message_key: str | None,
    sender: str | None,
) -> tuple[dict[str, Any], bool]:
    """Store one message; answers (message, created). A repeated Message-Id with the same bytes is the
    same message, with other bytes a conflict."""
    limit = ctx.settings.exchange.max_message_bytes
    if len(data) > limit:
        raise TooLarge(f"message body over {limit} bytes")
    digest = hashlib.sha256(data).hexdigest()
    if message_key is not None:
        existing = await _by_key(ctx, addressee, database, message_key)
        if existing is not None:
            return _same_or_conflict(existing, digest, message_key), False
    store = ctx.store
    now = store.now_ms()
    message_id = new_id("m", now)
    relative = files.mailbox_path(addressee, database, message_id)
    await write_body(ctx, relative, data)
    row = {
        "id": message_id,
        "addressee": addressee,
        "database": database,
        "message_key": message_key,
        "size": len(data),
        "sha256": digest,
        "content_type": content_type or "application/octet-stream",
        "sender": sender,
        "created_at": now,
        "state": "AVAILABLE",
        "path": relative,
        "synced": True,
    }
    try:
        async with store.transaction() as tx:
            await tx.execute(exchange_messages.insert().values(**row))
            await outbox.emit(
                tx, "exchange.message.stored", "exchange.message", message_id,
                {"addressee": addressee, "database": database, "size": len(data), "sha256": digest},
            )
            tx.notify(CHANNEL)
    except Exception as exc:
        await discard_body(ctx, relative)
        if message_key is not None and store.dialect.is_unique_violation(exc):
            existing = await _by_key(ctx, addressee, database, message_key)
            if existing is not None:
                return _same_or_conflict(existing, digest, message_key), False
        raise
    return message_to_api(SimpleNamespace(**row)), True


async def active_process_id(conn: Any, addressee: str, database: str) -> str | None:
    return (
        await conn.execute(
            select(exchange_processes.c.id).where(
                exchange_processes.c.addressee == addressee,
                exchange_processes.c.database == database,
                exchange_processes.c.state.in_(ACTIVE_STATES),
            )
        )
    ).scalar()


async def list_available(
    ctx: Context, addressee: str, database: str, *, limit: int, cursor: str | None
) -> dict[str, Any]:
    """API_1: the mailbox's available messages, oldest first, and whether a process holds it."""
    query = (
        select(exchange_messages)
        .where(
            exchange_messages.c.addressee == addressee,
            exchange_messages.c.database == database,
            exchange_messages.c.state == "AVAILABLE",
        )
        .order_by(exchange_messages.c.created_at, exchange_messages.c.id)
        .limit(limit + 1)
    )
    if cursor:
        at, last_id = decode_cursor(cursor, 2)
        query = query.where(
            (exchange_messages.c.created_at > at)
            | ((exchange_messages.c.created_at == at) & (exchange_messages.c.id > last_id))
        )
    async with ctx.store.read() as conn:
        rows = (await conn.execute(query)).all()
        active = await active_process_id(conn, addressee, database)
    next_cursor = encode_cursor(rows[limit - 1].created_at, rows[limit - 1].id) if len(rows) > limit else None
    return {
        "messages": [message_to_api(r) for r in rows[:limit]],
        "busy": active is not None,
        "active_process_id": active,
        "next_cursor": next_cursor,
    }


async def read_message(ctx: Context, addressee: str, database: str, message_id: str) -> tuple[dict[str, Any], bytes]:
    """One message's bytes while it can still be processed; committed or unpublished ones are not found."""
    async with ctx.store.read() as conn:
        row = (
            await conn.execute(
                select(exchange_messages).where(
                    exchange_messages.c.id == message_id,
                    exchange_messages.c.addressee == addressee,
                    exchange_messages.c.database == database,
                )
            )
        ).first()
    if row is None or row.state not in READABLE_STATES:
        raise MessageNotFound(f"no message {message_id} in this mailbox")
    data = await asyncio.to_thread(disk_of(ctx).read, file_candidates(row))
    if data is None:
        data = await asyncio.to_thread(disk_of(ctx).find_quarantined, row.id)
    if data is None:
        log.error("the file of message %s is missing from %s", message_id, row.path)
        raise MessageNotFound(f"the file of message {message_id} is missing")
    return message_to_api(row), data


async def list_mailboxes(ctx: Context) -> list[dict[str, Any]]:
    """Every mailbox with its count of available messages and its active process."""
    query = (
        select(
            exchange_messages.c.addressee,
            exchange_messages.c.database,
            func.count().label("available"),
        )
        .where(exchange_messages.c.state == "AVAILABLE")
        .group_by(exchange_messages.c.addressee, exchange_messages.c.database)
    )
    active_query = select(exchange_processes.c.addressee, exchange_processes.c.database, exchange_processes.c.id).where(
        exchange_processes.c.state.in_(ACTIVE_STATES)
    )
    async with ctx.store.read() as conn:
        counts = {(r.addressee, r.database): r.available for r in (await conn.execute(query)).all()}
        active = {(r.addressee, r.database): r.id for r in (await conn.execute(active_query)).all()}
    keys = sorted(set(counts) | set(active))
    return [
        {"addressee": a, "database": d, "available": counts.get((a, d), 0), "active_process_id": active.get((a, d))}
        for a, d in keys
    ]
