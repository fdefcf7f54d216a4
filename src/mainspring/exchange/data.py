"""Every statement of the exchange face, answering typed records: messages and mailboxes, the processing
protocol's transitions, the file moves that follow them, the watchdog and start-up recovery, the dashboard's
views, retention of finished processes and the counts ``/metrics`` shows.

Every transition locks the process row it changes (``lock_process``: ``FOR UPDATE`` on PostgreSQL) and
checks its state; background steps take their batches with ``SKIP LOCKED``, so two servers never take the
same rows. SQLite has one writer, so both are no-ops there (``mainspring.store.dialect``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    tuple_,
    update,
)

from mainspring.core import data as core_data
from mainspring.exchange.tables import ACTIVE_STATES, FINISHED_STATES, exchange_counts
from mainspring.exchange.tables import exchange_messages as M
from mainspring.exchange.tables import exchange_processes as P
from mainspring.store import Store, Transaction
from mainspring.store import counts as kept_counts
from mainspring.store.dialect import Executor
from mainspring.store.notify import PG_CHANNEL
from mainspring.store.schema import constant

# --- records ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageRow:
    """A message (or a process's reply) as stored.

    ``state``: PENDING (a reply not yet visible), AVAILABLE, TAKEN (by an active process), QUARANTINED
    (IN_DOUBT), COMMITTED (file still to go), GONE (deleted or in backup/), DISCARDED (a reply of an aborted
    process). ``path`` is where its file must be (None: deleted), ``prev_path`` where it may still be until
    ``synced``; ``file_version`` counts the decisions about the file."""

    id: str
    addressee: str
    database: str
    message_key: str | None
    size: int
    sha256: str
    content_type: str
    sender: str | None
    created_at: int
    state: str
    process_id: str | None
    origin_process_id: str | None
    path: str | None
    prev_path: str | None
    file_version: int
    synced: bool
    sync_attempts: int
    next_sync_at: int | None
    sync_error: str | None


@dataclass(frozen=True, slots=True)
class ProcessRow:
    """A process as stored (``state`` STARTED | READY_TO_COMMIT | IN_DOUBT | CLEANUP | DONE | ABORTED |
    CANCELLED); ``updated_at`` of a DONE or ABORTED one is when it finished."""

    id: str
    addressee: str
    database: str
    client_id: str
    message_ids: list[str]
    state: str
    started_at: int
    deadline: int | None
    updated_at: int
    error: str | None
    cleanup_attempts: int
    next_attempt_at: int | None


assert [f.name for f in dataclasses.fields(MessageRow)] == [c.name for c in M.c], "MessageRow drifted from the table"
assert [f.name for f in dataclasses.fields(ProcessRow)] == [c.name for c in P.c], "ProcessRow drifted from the table"


@dataclass(frozen=True, slots=True)
class NewMessage:
    """What storing a message (or a process's reply, with ``origin_process_id`` and state PENDING) writes;
    its file is already on disk at ``path``."""

    id: str
    addressee: str
    database: str
    message_key: str | None
    size: int
    sha256: str
    content_type: str
    sender: str | None
    created_at: int
    state: str
    path: str
    origin_process_id: str | None = None
    synced: bool = True


@dataclass(frozen=True, slots=True)
class MessageState:
    """Which mailbox a message is in, and its state (what API_2 checks before taking it)."""

    id: str
    addressee: str
    database: str
    state: str


@dataclass(frozen=True, slots=True)
class PublishedReply:
    """A reply that became visible when its process committed (what its ``exchange.message.stored`` says)."""

    id: str
    addressee: str
    database: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class FinishedProcess:
    """A DONE or ABORTED process; ``finished_at`` is when it reached that state."""

    id: str
    addressee: str
    database: str
    state: str
    finished_at: int


@dataclass(frozen=True, slots=True)
class MailboxCount:
    """How many AVAILABLE messages wait in a mailbox."""

    addressee: str
    database: str
    count: int


def _message(row: Any) -> MessageRow:
    return MessageRow(*row)


def _process(row: Any) -> ProcessRow:
    return ProcessRow(*row)


# --- messages and mailboxes ---------------------------------------------------------------------------


async def message_by_key(conn: Executor, addressee: str, database: str, message_key: str) -> MessageRow | None:
    """The message (or reply) stored in the mailbox under ``message_key`` (its Message-Id), if any."""
    row = (
        await conn.execute(
            select(M).where(M.c.addressee == addressee, M.c.database == database, M.c.message_key == message_key)
        )
    ).first()
    return None if row is None else _message(row)


_NEW_MESSAGE_FIELDS = tuple(f.name for f in dataclasses.fields(NewMessage))


def _insert_values(message: NewMessage) -> dict[str, object]:
    # Its fields as they are (``dataclasses.asdict`` deep-copies each value: a fifth of a put's insert).
    values = {name: getattr(message, name) for name in _NEW_MESSAGE_FIELDS}
    if values["origin_process_id"] is None:
        # A message from a sender names no process: the column is left out, as it always was.
        del values["origin_process_id"]
    return values


_INSERT_MESSAGES = M.insert()


async def insert_messages(tx: Executor, messages: Sequence[NewMessage]) -> None:
    """Store messages in one statement: producers' puts that arrived together, or a process's replies
    (PENDING: visible once it commits). A second message under a mailbox's Message-Id is refused (a unique
    violation), and with it the statement."""
    await tx.execute(_INSERT_MESSAGES, [_insert_values(m) for m in messages])


# PostgreSQL: producers' puts that arrived together and their ``exchange.message.stored`` events, one statement
# (``unnest`` arrays, one statement text whatever their number), prepared once per connection.
_PUT_COLUMNS = (
    ("id", "text"), ("addressee", "text"), ("database", "text"), ("message_key", "text"), ("size", "bigint"),
    ("sha256", "text"), ("content_type", "text"), ("sender", "text"), ("created_at", "bigint"), ("path", "text"),
)
_PUT_SQL = (
    "WITH s AS (SELECT * FROM unnest("
    + ", ".join(f"${n}::{kind}[]" for n, (_, kind) in enumerate(_PUT_COLUMNS, 1))
    + ") WITH ORDINALITY AS s(" + ", ".join(name for name, _ in _PUT_COLUMNS) + ", ord)), "
    "m AS (INSERT INTO exchange_messages (" + ", ".join(name for name, _ in _PUT_COLUMNS) + ", state, synced) "
    "SELECT " + ", ".join(name for name, _ in _PUT_COLUMNS) + ", 'AVAILABLE', true FROM s RETURNING 1), "
    f"ev AS (INSERT INTO events (type, at, subject_kind, subject_id, data) "
    f"SELECT 'exchange.message.stored', ${len(_PUT_COLUMNS) + 1}, 'exchange.message', s.id, jsonb_build_object("
    "'addressee', s.addressee, 'database', s.database, 'size', s.size, 'sha256', s.sha256) FROM s ORDER BY s.ord)"
)
_PUT_WITH_EVENTS = _PUT_SQL + " SELECT count(*) FROM m"
# The same as a whole transaction of its own (autocommit, one round trip): it sends the wake-ups to other
# servers itself, delivered when it commits.
_PUT_WITH_EVENTS_ALONE = (
    _PUT_SQL + f", wake AS (SELECT pg_notify(${len(_PUT_COLUMNS) + 2}, channel) "
    f"FROM unnest(${len(_PUT_COLUMNS) + 3}::text[]) AS channel) "
    "SELECT count(*) FROM m WHERE (SELECT count(*) FROM wake) >= 0"
)


async def insert_stored_with_events(
    tx: Transaction, messages: Sequence[NewMessage], at: int, wake: Sequence[str]
) -> None:
    """PostgreSQL: store producers' messages (AVAILABLE) with their ``exchange.message.stored`` events in one
    statement; in a transaction that may run it alone it is the whole transaction, and sends the wake-ups on
    ``wake`` itself. A second message under a mailbox's Message-Id is refused (a unique violation)."""
    arrays = [[getattr(m, name) for m in messages] for name, _ in _PUT_COLUMNS]
    if tx.may_run_alone:
        await tx.fetch_prepared_alone(_PUT_WITH_EVENTS_ALONE, *arrays, at, PG_CHANNEL, list(wake))
    else:
        await tx.fetch_prepared(_PUT_WITH_EVENTS, *arrays, at)


async def mailbox_message(conn: Executor, addressee: str, database: str, message_id: str) -> MessageRow | None:
    """Message ``message_id`` if it is in this mailbox, in whatever state."""
    query = select(M).where(M.c.id == message_id, M.c.addressee == addressee, M.c.database == database)
    row = (await conn.execute(query)).first()
    return None if row is None else _message(row)


async def get_message(conn: Executor, message_id: str) -> MessageRow | None:
    """Message ``message_id`` in whatever state and mailbox (the dashboard's look at it)."""
    row = (await conn.execute(select(M).where(M.c.id == message_id))).first()
    return None if row is None else _message(row)


async def available_messages(
    conn: Executor, addressee: str, database: str, limit: int, after: tuple[int, str] | None
) -> list[MessageRow]:
    """Up to ``limit`` AVAILABLE messages of the mailbox, oldest first, after ``(created_at, id)``."""
    query = (
        select(M)
        .where(M.c.addressee == addressee, M.c.database == database, M.c.state == "AVAILABLE")
        .order_by(M.c.created_at, M.c.id)
        .limit(limit)
    )
    if after is not None:
        at, last_id = after
        query = query.where((M.c.created_at > at) | ((M.c.created_at == at) & (M.c.id > last_id)))
    return [_message(r) for r in (await conn.execute(query)).all()]


# The statements of a cycle's calls (API_2, API_3, API_4), built once with their parameters bound at each call:
# building a statement and its cache key each time cost more of the server's CPU than running it (issue 36).
_ACTIVE_PROCESS = select(P.c.id).where(
    P.c.addressee == bindparam("b_addressee"), P.c.database == bindparam("b_database"), P.c.state.in_(ACTIVE_STATES))


async def active_process_id(conn: Executor, addressee: str, database: str) -> str | None:
    """The STARTED or READY_TO_COMMIT process that holds the mailbox, if one does."""
    value = (await conn.execute(_ACTIVE_PROCESS, {"b_addressee": addressee, "b_database": database})).scalar()
    return None if value is None else str(value)


async def available_by_mailbox(conn: Executor) -> dict[tuple[str, str], int]:
    """(addressee, database) → how many AVAILABLE messages, for every mailbox that has any (the kept counts:
    exact, no scan)."""
    counted = await kept_counts.read_counts(conn, exchange_counts, "messages", status="AVAILABLE")
    return {_mailbox(grp): n for (grp, _state), n in counted.items() if n > 0}


def _mailbox(grp: str) -> tuple[str, str]:
    addressee, database = kept_counts.group_values(grp)
    return addressee, database


async def active_process_by_mailbox(conn: Executor) -> dict[tuple[str, str], str]:
    """(addressee, database) → the active process that holds it, for every mailbox held."""
    query = select(P.c.addressee, P.c.database, P.c.id).where(P.c.state.in_(ACTIVE_STATES))
    return {(r.addressee, r.database): r.id for r in (await conn.execute(query)).all()}


async def known_message_ids(conn: Executor, message_ids: Sequence[str]) -> set[str]:
    """Those of ``message_ids`` that have a row (in any state)."""
    return set((await conn.execute(select(M.c.id).where(M.c.id.in_(message_ids)))).scalars())


# --- processes: reads ---------------------------------------------------------------------------------


# A process by id, built once: every call of a cycle reads or locks its process, and building the statement
# (and its cache key) each time cost more of the server's CPU than running it (issue 36's exchange profile).
_PROCESS_BY_ID: Select[Any] = select(P).where(P.c.id == bindparam("process_id"))
_LOCK_PROCESS_BY_ID: dict[str, Select[Any]] = {}


async def get_process(conn: Executor, process_id: str) -> ProcessRow | None:
    """The process, unlocked (what reads and API_3's first look use)."""
    row = (await conn.execute(_PROCESS_BY_ID, {"process_id": process_id})).first()
    return None if row is None else _process(row)


async def reload_process(tx: Executor, process_id: str) -> ProcessRow:
    """The process as this transaction just wrote it (it is there)."""
    return _process((await tx.execute(_PROCESS_BY_ID, {"process_id": process_id})).one())


async def lock_process(tx: Transaction, process_id: str) -> ProcessRow | None:
    """The process, locked until commit: every transition takes this lock before it checks the state, so a
    late call, the watchdog and another server wait for each other."""
    dialect = tx.store.dialect
    query = _LOCK_PROCESS_BY_ID.get(dialect.name)
    if query is None:
        query = _LOCK_PROCESS_BY_ID[dialect.name] = dialect.for_update(_PROCESS_BY_ID)
    row = (await tx.execute(query, {"process_id": process_id})).first()
    return None if row is None else _process(row)


async def list_processes(
    conn: Executor,
    *,
    state: str | None,
    addressee: str | None,
    database: str | None,
    limit: int,
    after: tuple[int, str] | None,
) -> list[ProcessRow]:
    """Up to ``limit`` processes matching the filters given, by start, after ``(started_at, id)``."""
    query = select(P).order_by(P.c.started_at, P.c.id).limit(limit)
    if state:
        query = query.where(P.c.state == state)
    if addressee:
        query = query.where(P.c.addressee == addressee)
    if database:
        query = query.where(P.c.database == database)
    if after is not None:
        at, last = after
        query = query.where(tuple_(P.c.started_at, P.c.id) > tuple_(at, last))  # a range of the index
    return [_process(r) for r in (await conn.execute(query)).all()]


async def messages_of_processes(conn: Executor, process_ids: Sequence[str]) -> list[MessageRow]:
    """The messages that ``process_ids`` took (whatever their state now), oldest first."""
    query = select(M).where(M.c.process_id.in_(process_ids)).order_by(M.c.created_at, M.c.id)
    return [_message(r) for r in (await conn.execute(query)).all()]


# --- processes: the protocol's transitions ------------------------------------------------------------


_MESSAGE_STATES = select(M.c.id, M.c.addressee, M.c.database, M.c.state).where(M.c.id.in_(bindparam("b_ids", expanding=True)))


async def message_states(tx: Executor, message_ids: Sequence[str]) -> dict[str, MessageState]:
    """Message id → its mailbox and state, for those of ``message_ids`` that exist."""
    rows = (await tx.execute(_MESSAGE_STATES, {"b_ids": list(message_ids)})).all()
    return {r.id: MessageState(r.id, r.addressee, r.database, r.state) for r in rows}


_INSERT_PROCESS = P.insert().values(
    id=bindparam("b_id"), addressee=bindparam("b_addressee"), database=bindparam("b_database"),
    client_id=bindparam("b_client_id"), message_ids=bindparam("b_message_ids", type_=P.c.message_ids.type),
    state="STARTED", started_at=bindparam("b_now"), deadline=bindparam("b_deadline"), updated_at=bindparam("b_now"),
)


async def insert_process(
    tx: Executor, process_id: str, addressee: str, database: str, client_id: str, message_ids: list[str],
    now: int, deadline: int,
) -> None:
    """A new STARTED process. The partial unique index on active processes refuses a second one for the
    mailbox (a unique violation): it decides between concurrent starts on any server."""
    await tx.execute(_INSERT_PROCESS, {
        "b_id": process_id, "b_addressee": addressee, "b_database": database, "b_client_id": client_id,
        "b_message_ids": message_ids, "b_now": now, "b_deadline": deadline,
    })


_TAKE_MESSAGES = (
    update(M).where(M.c.id.in_(bindparam("b_ids", expanding=True)), M.c.state == "AVAILABLE")
    .values(state="TAKEN", process_id=bindparam("b_process_id"))
)


async def take_mailbox_messages(tx: Executor, message_ids: Sequence[str], process_id: str) -> int:
    """AVAILABLE → TAKEN by ``process_id`` for ``message_ids``; answers how many were still available."""
    taken: Any = await tx.execute(_TAKE_MESSAGES, {"b_ids": list(message_ids), "b_process_id": process_id})
    return int(taken.rowcount)


async def extend_deadline(tx: Executor, process_id: str, deadline: int, now: int) -> None:
    """A heartbeat: the live process's deadline moves to ``deadline``."""
    await tx.execute(update(P).where(P.c.id == process_id).values(deadline=deadline, updated_at=now))


_MARK_READY = update(P).where(P.c.id == bindparam("b_id")).values(
    state="READY_TO_COMMIT", deadline=bindparam("b_deadline"), updated_at=bindparam("b_now"))


async def mark_process_ready(tx: Executor, process_id: str, deadline: int, now: int) -> None:
    """STARTED → READY_TO_COMMIT, with the commit deadline."""
    await tx.execute(_MARK_READY, {"b_id": process_id, "b_deadline": deadline, "b_now": now})


# By ``exchange.backup``: the committed files go to ``backup/`` (or are deleted: path NULL).
_COMMIT_MESSAGES = {
    backup: update(M)
    .where(M.c.process_id == bindparam("b_process_id"), M.c.state.in_(("TAKEN", "QUARANTINED")))
    .values(state="COMMITTED", prev_path=M.c.path, file_version=M.c.file_version + 1, synced=False,
            next_sync_at=bindparam("b_now"), sync_attempts=0,
            path=(literal("backup/") + M.c.addressee + "/" + M.c.database + "/" + M.c.id) if backup else None)
    .returning(*M.c)
    for backup in (False, True)
}
_PUBLISH_REPLIES = (
    update(M).where(M.c.origin_process_id == bindparam("b_process_id"), M.c.state == "PENDING").values(state="AVAILABLE")
    .returning(M.c.id, M.c.addressee, M.c.database, M.c.size, M.c.sha256)
)


async def commit_process_messages(
    tx: Executor, process_id: str, backup: bool, now: int
) -> tuple[list[PublishedReply], list[MessageRow]]:
    """The process's taken (or quarantined) messages are COMMITTED, their files to go to ``backup/`` (or be
    deleted), and its PENDING replies become AVAILABLE; answers those replies, and the committed messages as
    just written (the file moves API_4 does next: not read again)."""
    committed = (await tx.execute(_COMMIT_MESSAGES[backup], {"b_process_id": process_id, "b_now": now})).all()
    # Published in the statement that reads them (one statement, not a SELECT and an UPDATE).
    replies = (await tx.execute(_PUBLISH_REPLIES, {"b_process_id": process_id})).all()
    return ([PublishedReply(r.id, r.addressee, r.database, r.size, r.sha256) for r in sorted(replies, key=_id_of)],
            [_message(r) for r in committed])


def _id_of(row: Any) -> str:
    return str(row.id)


_MARK_COMMITTED = update(P).where(P.c.id == bindparam("b_id")).values(
    state="CLEANUP", deadline=None, updated_at=bindparam("b_now"), next_attempt_at=bindparam("b_now"))


async def mark_process_committed(tx: Executor, process_id: str, now: int) -> None:
    """→ CLEANUP: the client's database committed; the process is DONE once its message files are gone."""
    await tx.execute(_MARK_COMMITTED, {"b_id": process_id, "b_now": now})


async def give_back_messages(tx: Executor, process_id: str, now: int) -> None:
    """The process's messages are AVAILABLE again (a quarantined one's file goes back from ``unknown/`` to
    its mailbox) and its PENDING replies are DISCARDED (their files to be deleted, their Message-Id freed)."""
    home = literal("mailboxes/") + M.c.addressee + "/" + M.c.database + "/" + M.c.id
    quarantined = M.c.state == "QUARANTINED"
    await tx.execute(
        update(M)
        .where(M.c.process_id == process_id, M.c.state.in_(("TAKEN", "QUARANTINED")))
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
        .where(and_(M.c.origin_process_id == process_id, M.c.state == "PENDING"))
        .values(state="DISCARDED", message_key=None, prev_path=M.c.path, path=None,
                file_version=M.c.file_version + 1, synced=False, next_sync_at=now)
    )


async def end_process(tx: Executor, process_id: str, state: str, error: str | None, now: int) -> None:
    """→ ``state`` (ABORTED or CANCELLED), with no deadline and the reason."""
    await tx.execute(update(P).where(P.c.id == process_id).values(state=state, deadline=None, updated_at=now,
                                                                  error=error))


# --- the watchdog and start-up recovery ---------------------------------------------------------------


async def take_expired_started(tx: Transaction, now: int, limit: int) -> list[ProcessRow]:
    """Up to ``limit`` STARTED processes past their deadline, earliest first, locked (another server skips
    them)."""
    query = select(P).where(P.c.state == "STARTED", P.c.deadline <= now).order_by(P.c.deadline).limit(limit)
    return [_process(r) for r in (await tx.execute(tx.store.dialect.skip_locked(query))).all()]


async def take_ready_processes(tx: Transaction, now: int, limit: int, *, expired_only: bool) -> list[ProcessRow]:
    """Up to ``limit`` READY_TO_COMMIT processes (only those past their commit deadline if
    ``expired_only``), by id, locked (another server skips them)."""
    query = select(P).where(P.c.state == "READY_TO_COMMIT").order_by(P.c.id).limit(limit)
    if expired_only:
        query = query.where(P.c.deadline <= now)
    return [_process(r) for r in (await tx.execute(tx.store.dialect.skip_locked(query))).all()]


async def put_in_doubt(tx: Transaction, process_ids: Sequence[str], now: int) -> None:
    """The processes go IN_DOUBT: their TAKEN messages are QUARANTINED, files to ``unknown/<process_id>/``.
    (Start-up recovery passes 500 ids at a time: one array on PostgreSQL, not 500 parameters.)"""
    any_of = tx.store.dialect.any_of
    await tx.execute(
        update(M)
        .where(any_of(M.c.process_id, process_ids), M.c.state == "TAKEN")
        .values(state="QUARANTINED", prev_path=M.c.path,
                path=literal("unknown/") + M.c.process_id + "/" + M.c.id,
                file_version=M.c.file_version + 1, synced=False, next_sync_at=now, sync_attempts=0)
    )
    await tx.execute(update(P).where(any_of(P.c.id, process_ids)).values(state="IN_DOUBT", deadline=None, updated_at=now))


async def next_process_deadline(conn: Executor) -> int | None:
    """The earliest deadline of an active process (epoch ms), or None."""
    value = (await conn.execute(select(func.min(P.c.deadline)).where(P.c.state.in_(ACTIVE_STATES)))).scalar()
    return None if value is None else int(value)


async def delete_cancelled_processes(tx: Executor) -> int:
    """Start-up: CANCELLED processes are dropped (their messages went back when they were cancelled)."""
    result: Any = await tx.execute(delete(P).where(P.c.state == "CANCELLED"))
    return int(result.rowcount or 0)


async def cleanup_process_ids(tx: Executor, after: str, limit: int) -> list[str]:
    """Up to ``limit`` ids of processes in CLEANUP after ``after``, in order."""
    query = select(P.c.id).where(P.c.state == "CLEANUP", P.c.id > after).order_by(P.c.id).limit(limit)
    return [str(i) for i in (await tx.execute(query)).scalars()]


# --- file moves: making the disk follow the store -----------------------------------------------------


async def due_file_moves(conn: Executor, now: int, limit: int, process_id: str | None = None) -> list[MessageRow]:
    """Up to ``limit`` messages whose file move is due at ``now``, earliest first; only those a process took
    or wrote if ``process_id`` is given."""
    query = select(M).where(M.c.synced.is_(False), M.c.next_sync_at <= now).order_by(M.c.next_sync_at).limit(limit)
    if process_id is not None:
        query = query.where(or_(M.c.process_id == process_id, M.c.origin_process_id == process_id))
    return [_message(r) for r in (await conn.execute(query)).all()]


async def pending_file_moves(conn: Executor, after: str, limit: int, due_by: int | None = None) -> list[MessageRow]:
    """Up to ``limit`` messages with a file move not yet done, by id after ``after``: due or not, or only
    those due by ``due_by``."""
    query = select(M).where(M.c.synced.is_(False), M.c.id > after).order_by(M.c.id).limit(limit)
    if due_by is not None:
        query = query.where(M.c.next_sync_at <= due_by)
    return [_message(r) for r in (await conn.execute(query)).all()]


_MARK_SYNCED = (
    update(M)
    .where(M.c.id == bindparam("b_id"), M.c.file_version == bindparam("b_version"))
    .values(synced=True, sync_error=bindparam("b_error"), state=case((M.c.state == "COMMITTED", "GONE"), else_=M.c.state))
)


async def mark_files_synced(tx: Executor, moved: Sequence[tuple[str, int, str | None]]) -> None:
    """Record done moves, given as (message id, the ``file_version`` moved to, a note such as "file missing"):
    each is ``synced`` (a COMMITTED message is GONE) unless a newer decision about its file came meanwhile.
    Callers pass them in id order: rows are locked in that order by whoever records, so none deadlock."""
    # (One UPDATE from arrays was measured slower on PostgreSQL than this executemany: 4.4-8.8 s against
    # 3.0-3.6 s for 10,000 rows in batches of 500.)
    await tx.execute(_MARK_SYNCED, [{"b_id": i, "b_version": v, "b_error": e} for i, v, e in moved])


async def postpone_file_move(tx: Executor, message: MessageRow, attempts: int, next_at: int, error: str | None) -> None:
    """A failed move is retried at ``next_at``, unless a newer decision about the file came meanwhile."""
    await tx.execute(
        update(M)
        .where(M.c.id == message.id, M.c.file_version == message.file_version)
        .values(sync_attempts=attempts, next_sync_at=next_at, sync_error=error)
    )


async def file_version_of(tx: Executor, message_id: str) -> int | None:
    """The latest decision about the message's file (None: the message is gone)."""
    value = (await tx.execute(select(M.c.file_version).where(M.c.id == message_id))).scalar()
    return None if value is None else int(value)


async def next_file_move_due(conn: Executor) -> int | None:
    """When the earliest pending file move is due (epoch ms), or None."""
    value = (await conn.execute(select(func.min(M.c.next_sync_at)).where(M.c.synced.is_(False)))).scalar()
    return None if value is None else int(value)


async def failing_file_moves(conn: Executor, limit: int) -> list[MessageRow]:
    """Up to ``limit`` messages whose file move failed at least once and is still to do, next due first."""
    query = (
        select(M).where(M.c.synced.is_(False), M.c.sync_attempts > 0).order_by(M.c.next_sync_at).limit(limit)
    )
    return [_message(r) for r in (await conn.execute(query)).all()]


async def cleanup_attempts(tx: Executor, process_id: str) -> int | None:
    """How many times the process's cleanup failed, while it is in CLEANUP (None: it is not)."""
    row = (await tx.execute(select(P.c.cleanup_attempts).where(P.c.id == process_id, P.c.state == "CLEANUP"))).first()
    return None if row is None else int(row.cleanup_attempts)


async def postpone_cleanup(tx: Executor, process_id: str, attempts: int, next_at: int, now: int) -> None:
    """Count a failed cleanup round of a process still in CLEANUP; it is tried again at ``next_at``."""
    await tx.execute(update(P).where(P.c.id == process_id, P.c.state == "CLEANUP").values(
        cleanup_attempts=attempts, next_attempt_at=next_at, updated_at=now))


_STILL_COMMITTED = exists().where(M.c.process_id == P.c.id, M.c.state == "COMMITTED")
_ONE_CLEANUP_DONE = (
    update(P)
    .where(P.c.id == bindparam("b_id"), P.c.state == "CLEANUP", ~_STILL_COMMITTED)
    .values(state="DONE", updated_at=bindparam("b_now"), next_attempt_at=None)
    .returning(*P.c)
)


async def mark_cleanups_done(tx: Transaction, process_ids: Sequence[str]) -> list[ProcessRow]:
    """CLEANUP → DONE for those of ``process_ids`` none of whose messages is still COMMITTED (their files are
    gone or in ``backup/``); answers them as they now are (DONE), in id order. One statement: the check and
    the change together."""
    now = tx.store.now_ms()
    if len(process_ids) == 1:
        # API_4's own cleanup, every cycle: the statement built once.
        rows = (await tx.execute(_ONE_CLEANUP_DONE, {"b_id": process_ids[0], "b_now": now})).all()
    else:
        rows = (
            await tx.execute(
                update(P)
                .where(tx.store.dialect.any_of(P.c.id, list(process_ids)), P.c.state == "CLEANUP", ~_STILL_COMMITTED)
                .values(state="DONE", updated_at=now, next_attempt_at=None)
                .returning(*P.c)
            )
        ).all()
    return sorted((_process(r) for r in rows), key=_id_of)


# --- alerts that fix themselves -----------------------------------------------------------------------


async def process_states(conn: Executor, process_ids: Sequence[str]) -> dict[str, str]:
    """Process id → state, for those of ``process_ids`` that still exist."""
    if not process_ids:
        return {}
    query = select(P.c.id, P.c.state).where(P.c.id.in_(list(process_ids)))
    return {str(r.id): str(r.state) for r in (await conn.execute(query)).all()}


async def messages_synced(conn: Executor, message_ids: Sequence[str]) -> dict[str, bool]:
    """Message id → whether its file is where the store says, for those of ``message_ids`` that still exist."""
    if not message_ids:
        return {}
    query = select(M.c.id, M.c.synced).where(M.c.id.in_(list(message_ids)))
    return {str(r.id): bool(r.synced) for r in (await conn.execute(query)).all()}


# --- retention of finished processes ------------------------------------------------------------------


def _files_settled() -> ColumnElement[bool]:
    """The process's cleanup is over: no message it took and no reply it wrote still waits for its file to
    be moved or deleted (an ABORTED process may still be moving files back from ``unknown/``)."""
    taken = select(M.c.id).where(M.c.process_id == P.c.id, M.c.synced.is_(False)).exists()
    replies = select(M.c.id).where(M.c.origin_process_id == P.c.id, M.c.synced.is_(False)).exists()
    return and_(~taken, ~replies)


_REMOVABLE = and_(P.c.state.in_(FINISHED_STATES), _files_settled())


async def take_removable_processes(tx: Transaction, finished_before: int, limit: int) -> list[FinishedProcess]:
    """Up to ``limit`` finished processes whose cleanup is over and that finished at or before
    ``finished_before``, oldest first, locked (another server skips them; a late API_4/API_5 waits)."""
    query = (
        select(P.c.id, P.c.addressee, P.c.database, P.c.state, P.c.updated_at)
        .where(_REMOVABLE, P.c.updated_at <= finished_before)
        .order_by(P.c.updated_at, P.c.id)
        .limit(limit)
    )
    return [FinishedProcess(*row) for row in (await tx.execute(tx.store.dialect.skip_locked(query))).all()]


async def delete_processes_with_their_messages(tx: Executor, process_ids: list[str]) -> int:
    """Delete finished processes and the message rows that ended with them: the messages a DONE process
    committed (GONE) and the replies an ABORTED one discarded. Messages an ABORTED process gave back stay
    (they are available again). Answers how many message rows went."""
    ended_with_them = or_(
        and_(M.c.process_id.in_(process_ids), M.c.state == "GONE"),
        and_(M.c.origin_process_id.in_(process_ids), M.c.state == "DISCARDED"),
    )
    removed = await tx.execute(delete(M).where(ended_with_them, M.c.synced.is_(True)))
    await tx.execute(delete(P).where(P.c.id.in_(process_ids), P.c.state.in_(FINISHED_STATES)))
    return int(removed.rowcount or 0)


async def oldest_removable_finish(conn: Executor) -> int | None:
    """When the longest-finished process whose cleanup is over finished (epoch ms), or None."""
    value = (await conn.execute(select(func.min(P.c.updated_at)).where(_REMOVABLE))).scalar()
    return None if value is None else int(value)


# --- what /metrics shows ------------------------------------------------------------------------------


async def count_processes_by_state(conn: Executor) -> dict[str, int]:
    """Processes counted by state (the kept counts: exact, no scan)."""
    return kept_counts.by_status(await kept_counts.read_counts(conn, exchange_counts, "processes"))


async def most_waiting_mailboxes(conn: Executor, limit: int) -> tuple[list[MailboxCount], int]:
    """The ``limit`` mailboxes with the most available messages (most first), and the available messages
    of all mailboxes together (from the kept counts: one row per mailbox, no scan of the messages)."""
    available = await available_by_mailbox(conn)
    fullest = sorted(available.items(), key=lambda item: (-item[1], item[0]))[:limit]
    return [MailboxCount(a, d, n) for (a, d), n in fullest], sum(available.values())


# --- the dashboard --------------------------------------------------------------------------------------


async def count_by_state(conn: Executor) -> dict[str, dict[str, int]]:
    """Processes and messages counted by state."""
    return {kind: kept_counts.by_status(await kept_counts.read_counts(conn, exchange_counts, kind))
            for kind in ("processes", "messages")}


async def mean_cycle_by_bucket(conn: Executor, store: Store, since: int, until: int, bucket_ms: int) -> dict[int, float]:
    """Mean time from started to DONE (ms) of the processes done in each ``bucket_ms`` after ``since`` (of a sample:
    ``core.data.mean_duration_by_bucket``, on ``ix_exchange_processes_finished``)."""
    return await core_data.mean_duration_by_bucket(conn, P.c.started_at, P.c.updated_at, P.c.state == constant("DONE"), since, until,
                                                   bucket_ms, postgres=store.is_postgres)
