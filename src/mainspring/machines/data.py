"""Every statement of the machines face, answering typed records.

The hot paths are Call, Start and the background steps. Their statements are module constants (or built once
per engine), every value bound, so SQLAlchemy finds them compiled in its cache. A step's write is guarded by
the version it read (``UPDATE … WHERE uid = :uid AND version = :version``): an answer computed from version N
is applied only while the machine is still at N.

**No deadlocks between group commits.** A group transaction carries the steps of many machines, in whatever
order they arrived; two servers' groups taking machine rows in opposite orders would deadlock (PostgreSQL
breaks it after a second). So a grouped step never waits for a machine row: on PostgreSQL its guarded update
skips a row another transaction holds (``SKIP LOCKED``) and answers ``LOCKED``; the caller then applies the
step alone in a transaction of its own, which waits for that one row while holding nothing else.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVarTuple
from urllib.parse import quote, unquote

from sqlalchemy import (
    ColumnElement,
    Executable,
    Select,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    null,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.sql.elements import TextClause

from mainspring.core import leases
from mainspring.core.outbox import SEQUENCER_CHANNEL
from mainspring.machines.tables import (
    failures,
    history,
    machine_counts,
    machines,
    namespaces,
    notifications,
    operations,
)
from mainspring.store import Store, Transaction
from mainspring.store import counts as kept_counts
from mainspring.store.dialect import Backend, Executor, picked_once
from mainspring.store.notify import PG_CHANNEL
from mainspring.store.schema import constant
from mainspring.types import JsonData, JsonObject

Ts = TypeVarTuple("Ts")

# --- records ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NamespaceRow:
    name: str
    processor_url: str | None
    timeout_ms: int
    retry: JsonObject
    history: JsonObject
    updated_at: int
    processor_protocol: str | None
    """None: the JSON protocol."""
    retries: JsonObject | None
    """Retry policies per kind; None (or a kind absent): the namespace's ``retry``."""
    modernizer: JsonObject | None
    """Machinegun's event Modernizer (None: none)."""


@dataclass(frozen=True, slots=True)
class MachineRow:
    """A machine as stored (``status`` working | failed; ``wake_at`` = the earlier of timer and head
    notification, what the background loop looks for)."""

    uid: int
    namespace: str
    id: str
    status: str
    version: int
    last_event_id: int
    aux_state: JsonData
    timer_at: int | None
    notify_at: int | None
    wake_at: int | None
    retry_attempt: int
    retry_since: int | None
    lease_token: str | None
    lease_expires_at: int | None
    error: JsonObject | None
    created_at: int
    updated_at: int
    timer_range: JsonObject | None
    """The history the timer's ``timeout`` step is sent (None: the namespace's range)."""
    timer_timeout_ms: int | None
    """How long the timer's ``timeout`` step may take (None: the namespace's timeout)."""

    @property
    def subject(self) -> str:
        """The machine as events and alerts name it."""
        return machine_subject(self.namespace, self.id)


SUBJECT_SAFE = ":"
"""Kept as they are in a subject besides letters, digits and ``_.-~``: ids written before any other
character was allowed keep their subject."""
MAX_SUBJECT = 400
"""``events.subject_id`` and ``alerts.subject_id`` are this long."""


def machine_subject(namespace: str, machine_id: str) -> str:
    """``<ns>/<id>``, each percent-encoded so that a ``/`` in either stays unambiguous. One too long for the
    subject column is its first part and a hash (``#`` never occurs in an encoded name): still one subject per
    machine, so per-machine order holds, but it names no machine (``subject_machine`` answers None)."""
    subject = f"{quote(namespace, safe=SUBJECT_SAFE)}/{quote(machine_id, safe=SUBJECT_SAFE)}"
    if len(subject) <= MAX_SUBJECT:
        return subject
    digest = hashlib.sha256(f"{namespace}\x00{machine_id}".encode()).hexdigest()
    return f"{subject[: MAX_SUBJECT - len(digest) - 1]}#{digest}"


def subject_machine(subject: str) -> tuple[str, str] | None:
    """(namespace, id) of a machine subject; None for a hashed one or one that is not a machine's."""
    if "#" in subject or subject.count("/") != 1:
        return None
    namespace, machine_id = subject.split("/")
    return unquote(namespace), unquote(machine_id)


@dataclass(frozen=True, slots=True)
class HistoryRow:
    machine_uid: int
    event_id: int
    created_at: int
    data: JsonData


@dataclass(frozen=True, slots=True)
class NotificationRow:
    seq: int
    id: str
    machine_uid: int
    args: JsonData
    created_at: int
    due_at: int
    attempts: int
    first_failed_at: int | None
    history_range: JsonObject | None
    """The history the notification's step is sent (None: the namespace's range)."""


@dataclass(frozen=True, slots=True)
class OperationRow:
    namespace: str
    machine_id: str
    key: str
    kind: str
    status_code: int
    body: JsonObject
    created_at: int


@dataclass(frozen=True, slots=True)
class FailureRow:
    seq: int
    machine_uid: int
    at: int
    kind: str
    code: str
    detail: str
    permanent: bool
    attempt: int
    outcome: str


for _record, _table in (
    (NamespaceRow, namespaces),
    (MachineRow, machines),
    (HistoryRow, history),
    (NotificationRow, notifications),
    (OperationRow, operations),
    (FailureRow, failures),
):
    assert [f.name for f in dataclasses.fields(_record)] == [c.name for c in _table.c], f"{_record.__name__} drifted from {_table.name}"

_MACHINE_WIDTH = len(machines.c)


def _machine(row: Sequence[Any]) -> MachineRow:
    return MachineRow(*row[:_MACHINE_WIDTH])


def _namespace(row: Sequence[Any]) -> NamespaceRow:
    return NamespaceRow(*row)


# --- namespaces -------------------------------------------------------------------------------------------

_NAMESPACE = select(namespaces).where(namespaces.c.name == bindparam("name"))


async def get_namespace(conn: Executor, name: str) -> NamespaceRow | None:
    row = (await conn.execute(_NAMESPACE, {"name": name})).first()
    return None if row is None else _namespace(row)


async def save_namespace(tx: Transaction, name: str, values: Mapping[str, object]) -> NamespaceRow:
    """Create or replace namespace ``name`` (``values``: every column but the name)."""
    insert = tx.store.dialect.insert(namespaces).values(name=name, **values)
    upsert = insert.on_conflict_do_update(index_elements=[namespaces.c.name], set_=values).returning(*namespaces.c)
    return _namespace((await tx.execute(upsert)).one())


async def namespace_names(conn: Executor) -> set[str]:
    """Every namespace stored or used by a machine (those from the kept counts: not a scan of the machines)."""
    stored = set((await conn.execute(select(namespaces.c.name))).scalars())
    return stored | {grp for grp, _status in await kept_counts.read_counts(conn, machine_counts, "machines")}


# --- machines: reads --------------------------------------------------------------------------------------

_BY_NAME = and_(machines.c.namespace == bindparam("namespace"), machines.c.id == bindparam("id"))
_MACHINE = select(machines).where(_BY_NAME)
# A step's read: the machine and its namespace's stored settings in one statement.
_MACHINE_AND_NAMESPACE = (
    select(machines, namespaces)
    .select_from(machines.outerjoin(namespaces, namespaces.c.name == machines.c.namespace))
    .where(_BY_NAME)
)
# Get: the machine and how many notifications wait, read in one statement. Two statements would be two
# snapshots under READ COMMITTED: a delivery committing between them would show its notification neither
# pending (the later count) nor in the history (bounded by the earlier row).
_MACHINE_AND_PENDING = select(
    machines,
    select(func.count()).select_from(notifications).where(notifications.c.machine_uid == machines.c.uid).scalar_subquery(),
).where(_BY_NAME)
_UID_EXISTS = select(machines.c.uid).where(_BY_NAME)
# Start's read: the namespace's stored row (if any) and whether the id is taken, in one statement.
_ONE = select(literal(1).label("one")).subquery()
_NAMESPACE_AND_TAKEN = select(namespaces, _UID_EXISTS.exists()).select_from(
    _ONE.outerjoin(namespaces, namespaces.c.name == bindparam("namespace"))
)


async def get_machine(conn: Executor, namespace: str, machine_id: str) -> MachineRow | None:
    row = (await conn.execute(_MACHINE, {"namespace": namespace, "id": machine_id})).first()
    return None if row is None else _machine(row)


async def machine_and_namespace(conn: Executor, namespace: str, machine_id: str) -> tuple[MachineRow | None, NamespaceRow | None]:
    """The machine (None if absent) and its namespace's stored row (None if not stored or the machine is
    absent: then ask ``get_namespace``)."""
    row = (await conn.execute(_MACHINE_AND_NAMESPACE, {"namespace": namespace, "id": machine_id})).first()
    if row is None:
        return None, None
    stored = row[_MACHINE_WIDTH:]
    return _machine(row), (None if stored[0] is None else _namespace(stored))


_MACHINES_AND_NAMESPACES = (
    select(machines, namespaces)
    .select_from(machines.outerjoin(namespaces, namespaces.c.name == machines.c.namespace))
    .where(tuple_(machines.c.namespace, machines.c.id).in_(bindparam("keys", expanding=True)))
)


# PostgreSQL: the same read with the keys bound as two arrays. An IN list of n keys is a different statement
# for every n (prepared again on every connection for every group size, and planned with 2n parameters).
_MACHINES_AND_NAMESPACES_PG = text(
    f"SELECT {', '.join(f'machines.{c.name}' for c in machines.c)}, {', '.join(f'ns.{c.name}' for c in namespaces.c)} "
    "FROM unnest(CAST(:namespaces AS text[]), CAST(:ids AS text[])) AS k(namespace, id) "
    "JOIN machines ON machines.namespace = k.namespace AND machines.id = k.id "
    "LEFT JOIN machine_namespaces AS ns ON ns.name = machines.namespace"
)


async def _fetch_all(conn: Executor, pg: TextClause, pg_params: dict[str, object], portable: Executable, params: dict[str, object]) -> Sequence[Any]:
    """The rows of ``pg`` (a plain textual statement, arrays bound whole) run straight on asyncpg when ``conn``
    is a PostgreSQL read session; of ``portable`` otherwise (SQLite, or a transaction)."""
    fetch = getattr(conn, "fetch_text", None)
    if fetch is None:
        return (await conn.execute(portable, params)).all()
    return (await fetch(pg, pg_params)).all()  # type: ignore[no-any-return]


async def machines_and_namespaces(conn: Executor, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[MachineRow, NamespaceRow | None]]:
    """``machine_and_namespace`` of many machines in one statement: per (namespace, id) found, the machine and
    its namespace's stored row (None: not stored)."""
    unique = sorted(set(keys))
    rows = await _fetch_all(conn, _MACHINES_AND_NAMESPACES_PG, {"namespaces": [k[0] for k in unique], "ids": [k[1] for k in unique]},
                            _MACHINES_AND_NAMESPACES, {"keys": unique})
    found: dict[tuple[str, str], tuple[MachineRow, NamespaceRow | None]] = {}
    for row in rows:
        machine, stored = _machine(row), row[_MACHINE_WIDTH:]
        found[(machine.namespace, machine.id)] = (machine, None if stored[0] is None else _namespace(stored))
    return found


async def machine_with_pending(conn: Executor, namespace: str, machine_id: str) -> tuple[MachineRow, int] | None:
    """The machine and the number of its pending notifications, as of one moment."""
    row = (await conn.execute(_MACHINE_AND_PENDING, {"namespace": namespace, "id": machine_id})).first()
    return None if row is None else (_machine(row), int(row[_MACHINE_WIDTH]))


async def namespace_and_taken(conn: Executor, namespace: str, machine_id: str) -> tuple[NamespaceRow | None, bool]:
    """The namespace's stored row (None: not stored) and whether machine ``machine_id`` exists in it."""
    row = (await conn.execute(_NAMESPACE_AND_TAKEN, {"namespace": namespace, "id": machine_id})).one()
    stored = row[: len(namespaces.c)]
    return (None if stored[0] is None else _namespace(stored)), bool(row[-1])


async def machine_exists(conn: Executor, namespace: str, machine_id: str) -> bool:
    return (await conn.execute(_UID_EXISTS, {"namespace": namespace, "id": machine_id})).first() is not None


async def lock_machine(tx: Transaction, namespace: str, machine_id: str) -> MachineRow | None:
    """The machine, its row locked until commit (Notify and Remove take it before anything else)."""
    row = (await tx.execute(_for_update(tx.store, _MACHINE), {"namespace": namespace, "id": machine_id})).first()
    return None if row is None else _machine(row)


@functools.cache
def _for_update_cached(dialect: str, query: Select[*Ts]) -> Select[*Ts]:
    return query.with_for_update() if dialect == "postgresql" else query


def _for_update(store: Store, query: Select[*Ts]) -> Select[*Ts]:
    return _for_update_cached(store.dialect.name, query)


async def list_machines(conn: Executor, namespace: str, status: str | None, after_id: str | None, limit: int) -> list[MachineRow]:
    """One namespace's machines by id, after ``after_id``."""
    query = select(machines).where(machines.c.namespace == namespace).order_by(machines.c.id).limit(limit)
    if status is not None:
        query = query.where(machines.c.status == status)
    if after_id is not None:
        query = query.where(machines.c.id > after_id)
    return [_machine(r) for r in (await conn.execute(query)).all()]


async def search_machines(conn: Executor, status: str | None, id_part: str | None, limit: int, namespace: str | None = None) -> list[MachineRow]:
    """Machines of every namespace (or of ``namespace``) whose id contains ``id_part``."""
    query = select(machines).order_by(machines.c.namespace, machines.c.id).limit(limit)
    if namespace:
        query = query.where(machines.c.namespace == namespace)
    if status:
        query = query.where(machines.c.status == status)
    if id_part:
        query = query.where(machines.c.id.contains(id_part, autoescape=True))
    return [_machine(r) for r in (await conn.execute(query)).all()]


async def count_by_status(conn: Executor) -> dict[str, int]:
    """Machines counted by status (the kept counts: exact, no scan)."""
    return kept_counts.by_status(await kept_counts.read_counts(conn, machine_counts, "machines"))


async def count_by_namespace_and_status(conn: Executor, namespace: str | None = None) -> list[tuple[str, str, int]]:
    """Machines counted per (namespace, status), of every namespace or one (the kept counts)."""
    counted = await kept_counts.read_counts(conn, machine_counts, "machines", namespace)
    return [(ns, status, n) for (ns, status), n in counted.items()]


async def due_timers_by_namespace(conn: Executor, now: int) -> list[tuple[str, int, int]]:
    """Per namespace, the working machines whose timer is due and not yet fired: (namespace, count, earliest
    due ms). A backlog that stays means the processors (or this face's workers) cannot keep up."""
    query = (
        select(machines.c.namespace, func.count(), func.min(machines.c.timer_at))
        # A constant, so that a generic plan still implies ix_machines_timers' WHERE (``store.schema.constant``).
        .where(machines.c.status == constant("working"), machines.c.timer_at <= now)
        .group_by(machines.c.namespace)
    )
    return [(str(ns), int(n), int(oldest)) for ns, n, oldest in (await conn.execute(query)).all()]


async def statuses_of(conn: Executor, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The status of each (namespace, id) that exists."""
    found: dict[tuple[str, str], str] = {}
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        query = select(machines.c.namespace, machines.c.id, machines.c.status).where(
            tuple_(machines.c.namespace, machines.c.id).in_(list(chunk))
        )
        found.update({(str(ns), str(mid)): str(status) for ns, mid, status in (await conn.execute(query)).all()})
    return found


_VERSION = select(machines.c.version).where(machines.c.uid == bindparam("uid"))


async def current_version(conn: Executor, uid: int) -> int | None:
    value = (await conn.execute(_VERSION, {"uid": uid})).scalar()
    return None if value is None else int(value)


# --- history ----------------------------------------------------------------------------------------------


@functools.cache
def _history_query(backward: bool, after: bool, limit: bool) -> Select[Any]:
    query = select(history).where(history.c.machine_uid == bindparam("uid"), history.c.event_id <= bindparam("last"))
    if after:
        query = query.where(history.c.event_id < bindparam("after") if backward else history.c.event_id > bindparam("after"))
    query = query.order_by(history.c.event_id.desc() if backward else history.c.event_id)
    return query.limit(bindparam("limit")) if limit else query


async def read_history(conn: Executor, machine: MachineRow, after: int | None, limit: int | None, backward: bool) -> list[HistoryRow]:
    """A range of the history of ``machine`` as read: never past its ``last_event_id``, so a step committing
    after the row was read cannot show events newer than the row they belong with."""
    query = _history_query(backward, after is not None, limit is not None)
    rows = await conn.execute(query, {"uid": machine.uid, "last": machine.last_event_id, "after": after, "limit": limit})
    return [HistoryRow(*r) for r in rows.all()]


_WHOLE_HISTORIES = (
    select(history).where(history.c.machine_uid.in_(bindparam("uids", expanding=True))).order_by(history.c.machine_uid, history.c.event_id)
)


# PostgreSQL: the same with the machines bound as arrays (one statement for any number of them), each history
# bounded by its row's ``last_event_id`` in the statement.
_WHOLE_HISTORIES_PG = text(
    "SELECT h.machine_uid, h.event_id, h.created_at, h.data FROM unnest(CAST(:uids AS bigint[]), CAST(:lasts AS integer[])) AS k(uid, last) "
    "JOIN machine_history AS h ON h.machine_uid = k.uid AND h.event_id <= k.last ORDER BY h.machine_uid, h.event_id"
)


async def whole_histories(conn: Executor, batch: Sequence[MachineRow]) -> dict[int, list[HistoryRow]]:
    """The whole history of each machine of ``batch`` in one query, each bounded by the row as read."""
    bound = {m.uid: m.last_event_id for m in batch}
    found: dict[int, list[HistoryRow]] = {uid: [] for uid in bound}
    if not bound:
        return found
    uids = sorted(bound)
    rows = await _fetch_all(conn, _WHOLE_HISTORIES_PG, {"uids": uids, "lasts": [bound[u] for u in uids]}, _WHOLE_HISTORIES, {"uids": uids})
    for row in rows:
        if row[1] <= bound[row[0]]:
            found[row[0]].append(HistoryRow(*row))
    return found


# --- notifications ----------------------------------------------------------------------------------------

_INSERT_NOTIFICATION = notifications.insert()
_HEAD_DUE = select(notifications.c.due_at).where(notifications.c.machine_uid == bindparam("uid")).order_by(notifications.c.seq).limit(1)
_SET_NOTIFY_AT = (
    machines.update()
    .where(machines.c.uid == bindparam("b_uid"))
    .values(
        notify_at=bindparam("b_head", type_=machines.c.notify_at.type),
        wake_at=case(
            (bindparam("b_head", type_=machines.c.notify_at.type).is_(None), machines.c.timer_at),
            (machines.c.timer_at.is_(None), bindparam("b_head", type_=machines.c.notify_at.type)),
            (machines.c.timer_at < bindparam("b_head", type_=machines.c.notify_at.type), machines.c.timer_at),
            else_=bindparam("b_head", type_=machines.c.notify_at.type),
        ),
    )
)
_DELETE_NOTIFICATION = delete(notifications).where(notifications.c.seq == bindparam("seq"))
_RESCHEDULE_NOTIFICATION = (
    notifications.update()
    .where(notifications.c.seq == bindparam("b_seq"))
    .values(attempts=bindparam("b_attempts"), first_failed_at=bindparam("b_since"), due_at=bindparam("b_due"))
)
_COUNT_PENDING = select(func.count()).select_from(notifications).where(notifications.c.machine_uid == bindparam("uid"))


async def insert_notification(tx: Transaction, notification_id: str, uid: int, args: object, now: int, history_range: JsonObject | None = None) -> None:
    """Queue a notification (the machine's row held by ``tx``) and point ``notify_at`` at the queue's head."""
    values = {"id": notification_id, "machine_uid": uid, "args": args, "created_at": now, "due_at": now, "attempts": 0, "history_range": history_range}
    await tx.execute(_INSERT_NOTIFICATION, values)
    await refresh_notify_at(tx, uid)


async def refresh_notify_at(tx: Transaction, uid: int) -> None:
    """Point ``notify_at`` (and ``wake_at``) at the oldest pending notification: they go strictly in order.

    Its own statements, after the machine row is held: the head is read in a snapshot taken after every
    writer of this machine's queue that held the row before us had committed."""
    head = (await tx.execute(_HEAD_DUE, {"uid": uid})).scalar()
    await tx.execute(_SET_NOTIFY_AT, {"b_uid": uid, "b_head": head})


async def delete_notification(tx: Transaction, seq: int) -> None:
    await tx.execute(_DELETE_NOTIFICATION, {"seq": seq})


async def reschedule_notification(tx: Transaction, seq: int, attempts: int, first_failed_at: int, due_at: int) -> None:
    await tx.execute(_RESCHEDULE_NOTIFICATION, {"b_seq": seq, "b_attempts": attempts, "b_since": first_failed_at, "b_due": due_at})


async def count_pending(conn: Executor, uid: int) -> int:
    return int((await conn.execute(_COUNT_PENDING, {"uid": uid})).scalar_one())


_FIRST_NOTIFICATIONS = (
    select(notifications.c.machine_uid, func.min(notifications.c.seq).label("seq"))
    .where(notifications.c.machine_uid.in_(bindparam("uids", expanding=True)))
    .group_by(notifications.c.machine_uid)
    .subquery()
)
_HEAD_NOTIFICATIONS = select(notifications).join(_FIRST_NOTIFICATIONS, notifications.c.seq == _FIRST_NOTIFICATIONS.c.seq)


async def head_notifications(conn: Executor, uids: Sequence[int]) -> dict[int, NotificationRow]:
    """The oldest pending notification of each of these machines, in one query."""
    if not uids:
        return {}
    rows = await conn.execute(_HEAD_NOTIFICATIONS, {"uids": sorted(set(uids))})
    return {r.machine_uid: NotificationRow(*r) for r in rows.all()}


async def pending_notifications(conn: Executor, namespace: str, machine_id: str, limit: int) -> list[NotificationRow]:
    query = (
        select(notifications)
        .join(machines, machines.c.uid == notifications.c.machine_uid)
        .where(machines.c.namespace == namespace, machines.c.id == machine_id)
        .order_by(notifications.c.seq)
        .limit(limit)
    )
    return [NotificationRow(*r) for r in (await conn.execute(query)).all()]


# --- idempotent operations and the failure journal --------------------------------------------------------

_OPERATION = select(operations).where(
    operations.c.namespace == bindparam("namespace"), operations.c.machine_id == bindparam("machine_id"), operations.c.key == bindparam("key")
)
_INSERT_OPERATION = operations.insert()
_INSERT_FAILURE = failures.insert()


async def get_operation(conn: Executor, namespace: str, machine_id: str, key: str) -> OperationRow | None:
    row = (await conn.execute(_OPERATION, {"namespace": namespace, "machine_id": machine_id, "key": key})).first()
    return None if row is None else OperationRow(*row)


async def insert_operation(tx: Transaction, operation: OperationRow) -> None:
    """Remember an operation's answer; a second insert of the key fails the transaction (unique violation)."""
    await tx.execute(_INSERT_OPERATION, dataclasses.asdict(operation))


async def insert_failure(
    tx: Transaction, uid: int, at: int, kind: str, code: str, detail: str, *, permanent: bool, attempt: int, outcome: str
) -> None:
    await tx.execute(
        _INSERT_FAILURE,
        {"machine_uid": uid, "at": at, "kind": kind, "code": code, "detail": detail[:4000], "permanent": permanent, "attempt": attempt, "outcome": outcome},
    )


async def recent_failures(conn: Executor, uid: int, limit: int) -> list[FailureRow]:
    """The newest ``limit`` journal entries, oldest first."""
    query = select(failures).where(failures.c.machine_uid == uid).order_by(failures.c.seq.desc()).limit(limit)
    return [FailureRow(*r) for r in reversed((await conn.execute(query)).all())]


# --- machines: writes -------------------------------------------------------------------------------------

_INSERT_MACHINE = machines.insert().returning(*machines.c)
_INSERT_HISTORY = history.insert()


async def insert_machine(
    tx: Transaction, namespace: str, machine_id: str, aux_state: object, timer_at: int | None, last_event_id: int, now: int,
    timer_range: JsonObject | None = None, timer_timeout_ms: int | None = None, lease: tuple[str, int] | None = None,
) -> MachineRow:
    """A new working machine at version 1 (a duplicate (namespace, id) is a unique violation), leased with
    ``lease`` (token, expiry) when given."""
    values = {
        "namespace": namespace, "id": machine_id, "status": "working", "version": 1, "last_event_id": last_event_id,
        "aux_state": aux_state, "timer_at": timer_at, "notify_at": None, "wake_at": timer_at, "retry_attempt": 0,
        "retry_since": None, "lease_token": None if lease is None else lease[0], "lease_expires_at": None if lease is None else lease[1],
        "error": None, "created_at": now, "updated_at": now,
        "timer_range": timer_range, "timer_timeout_ms": timer_timeout_ms,
    }
    return _machine((await tx.execute(_INSERT_MACHINE, values)).one())


async def insert_history(tx: Transaction, uid: int, first: int, events: Sequence[object], now: int) -> None:
    """Append ``events`` as ids ``first``, ``first+1``… — the (machine, id) key refuses a duplicate."""
    if events:
        await tx.execute(_INSERT_HISTORY, [{"machine_uid": uid, "event_id": first + i, "created_at": now, "data": data} for i, data in enumerate(events)])


async def replace_event(tx: Transaction, uid: int, event_id: int, data: object) -> bool:
    """Rewrite one event's data in place (Machinegun's Modernizer); False when the event is gone."""
    done = await tx.execute(update(history).where(history.c.machine_uid == uid, history.c.event_id == event_id).values(data=data))
    return bool(done.rowcount)


class Applied(enum.Enum):
    """How a guarded write of a step ended."""

    APPLIED = "applied"
    MOVED_ON = "moved_on"
    """The machine is no longer at the version the step read: nothing was written."""
    LOCKED = "locked"
    """Another transaction holds the machine's row (PostgreSQL, grouped): nothing was written; apply it alone."""


@dataclass(frozen=True, slots=True)
class StepWrite:
    """What a step changes on the machine row, from the version it read."""

    uid: int
    version: int
    last_event_id: int
    aux_state: object
    """Written as JSON by the column's type."""
    timer_at: int | None
    retry_attempt: int
    retry_since: int | None
    status: str
    error: JsonObject | None
    updated_at: int
    timer_range: JsonObject | None = None
    timer_timeout_ms: int | None = None
    lease_token: str | None = None
    """The lease the machine keeps after the step (None: the step ends it). A driven machine (a workflow run)
    keeps its lease from one step to the next while its server advances it."""
    lease_expires_at: int | None = None


def _typed(name: str) -> Any:
    return bindparam(name, type_=machines.c[name.removeprefix("b_")].type)


_STEP_VALUES = {
    "version": bindparam("b_version") + 1,
    "last_event_id": _typed("b_last_event_id"),
    "aux_state": _typed("b_aux_state"),
    "timer_at": _typed("b_timer_at"),
    # The head notification may have changed without a new version (Notify): wake_at is computed from the
    # notify_at the row has when this statement holds it.
    "wake_at": case(
        (_typed("b_timer_at").is_(None), machines.c.notify_at),
        (machines.c.notify_at.is_(None), _typed("b_timer_at")),
        (machines.c.notify_at < _typed("b_timer_at"), machines.c.notify_at),
        else_=_typed("b_timer_at"),
    ),
    "retry_attempt": _typed("b_retry_attempt"),
    "retry_since": _typed("b_retry_since"),
    "status": _typed("b_status"),
    "error": _typed("b_error"),
    "lease_token": _typed("b_lease_token"),
    "lease_expires_at": _typed("b_lease_expires_at"),
    "updated_at": _typed("b_updated_at"),
    "timer_range": _typed("b_timer_range"),
    "timer_timeout_ms": _typed("b_timer_timeout_ms"),
}
_APPLY_STEP = machines.update().where(machines.c.uid == bindparam("b_uid"), machines.c.version == bindparam("b_version")).values(**_STEP_VALUES)
def _step_params(step: StepWrite) -> dict[str, object]:
    return {
        "b_uid": step.uid, "b_version": step.version, "b_last_event_id": step.last_event_id, "b_aux_state": step.aux_state,
        "b_timer_at": step.timer_at, "b_retry_attempt": step.retry_attempt, "b_retry_since": step.retry_since,
        "b_status": step.status, "b_error": step.error, "b_updated_at": step.updated_at,
        "b_timer_range": step.timer_range, "b_timer_timeout_ms": step.timer_timeout_ms,
        "b_lease_token": step.lease_token, "b_lease_expires_at": step.lease_expires_at,
    }


@dataclass(frozen=True, slots=True)
class StepRows:
    """Everything one step writes: its machine row (``step``, read as ``machine``), its new history events (one
    ``machine.event`` each) and, for a step with an idempotency key, the operation it answers."""

    machine: MachineRow
    step: StepWrite
    events: Sequence[JsonData]
    operation: OperationRow | None = None
    announce: Sequence[tuple[str, str, str, object]] = ()
    """(type, subject kind, subject id, data) of each event of the step besides its ``machine.event`` ones (a
    workflow's end), written after them in the same statement."""
    channels: Sequence[str] = ()
    """Wake-ups the step sends once applied, besides the machines' own."""


# Per step, one element of each array (the machine row, its operation); per event, one of each ``e_`` array.
_STEPS_UNNEST = (
    ("uid", "bigint"), ("version", "integer"), ("last_event_id", "integer"), ("aux_state", "jsonb"), ("timer_at", "bigint"),
    ("retry_attempt", "integer"), ("retry_since", "bigint"), ("status", "text"), ("error", "jsonb"), ("now", "bigint"),
    ("timer_range", "jsonb"), ("timer_timeout_ms", "integer"), ("subject", "text"), ("namespace", "text"), ("id", "text"),
    ("op_key", "text"), ("op_kind", "text"), ("op_status", "integer"), ("op_body", "jsonb"),
    ("lease_token", "text"), ("lease_expires_at", "bigint"),
)
_EVENTS_UNNEST = (("e_uid", "bigint"), ("e_event_id", "integer"), ("e_data", "jsonb"))
_ANNOUNCE_UNNEST = (("x_uid", "bigint"), ("x_type", "text"), ("x_kind", "text"), ("x_subject", "text"), ("x_data", "jsonb"))


def _unnest(columns: Sequence[tuple[str, str]], alias: str) -> str:
    arrays = ", ".join(f"CAST(:{name} AS {kind}[])" for name, kind in columns)
    return f"SELECT * FROM unnest({arrays}) WITH ORDINALITY AS {alias}({', '.join(n for n, _ in columns)}, ord)"


def _steps_cte(lock: str, alone: bool) -> TextClause:
    """PostgreSQL: the machine rows, history rows, ``machine.event`` events and operations of many steps (of
    different machines) in one statement. ``target`` takes the rows (``lock``: wait, or skip a held one); the
    answer tells per step, in order, whether its row was taken and whether its version still matched. ``alone``:
    the statement is its whole transaction (autocommit), so it sends its wake-ups itself."""
    timer = "s.timer_at"
    wake = (
        ", wake AS (SELECT pg_notify(:pg_channel, channel) FROM unnest(CAST(:channels AS text[])) AS channel "
        "WHERE EXISTS (SELECT 1 FROM m)) "
        if alone else " "
    )
    return text(
        f"WITH s AS ({_unnest(_STEPS_UNNEST, 's')}), "
        f"target AS (SELECT uid FROM machines WHERE uid = ANY(CAST(:uid AS bigint[])) ORDER BY uid FOR UPDATE{lock}), "
        "m AS (UPDATE machines SET version = s.version + 1, last_event_id = s.last_event_id, aux_state = s.aux_state, "
        f"timer_at = {timer}, "
        f"wake_at = CASE WHEN {timer} IS NULL THEN machines.notify_at WHEN machines.notify_at IS NULL THEN {timer} "
        f"WHEN machines.notify_at < {timer} THEN machines.notify_at ELSE {timer} END, "
        "retry_attempt = s.retry_attempt, retry_since = s.retry_since, status = s.status, error = s.error, "
        "lease_token = s.lease_token, lease_expires_at = s.lease_expires_at, updated_at = s.now, timer_range = s.timer_range, "
        "timer_timeout_ms = s.timer_timeout_ms "
        "FROM s JOIN target ON target.uid = s.uid WHERE machines.uid = s.uid AND machines.version = s.version "
        "RETURNING machines.uid), "
        f"e AS ({_unnest(_EVENTS_UNNEST, 'e')}), "
        "h AS (INSERT INTO machine_history (machine_uid, event_id, created_at, data) "
        "SELECT e.e_uid, e.e_event_id, s.now, e.e_data FROM e JOIN m ON m.uid = e.e_uid JOIN s ON s.uid = e.e_uid), "
        f"xs AS ({_unnest(_ANNOUNCE_UNNEST, 'xs')}), "
        "ev AS (INSERT INTO events (type, at, subject_kind, subject_id, data) "
        "SELECT q.type, q.at, q.kind, q.subject, q.data FROM ("
        "SELECT 'machine.event' AS type, s.now AS at, 'machine' AS kind, s.subject AS subject, jsonb_build_object("
        "'namespace', s.namespace, 'id', s.id, 'event_id', e.e_event_id, 'data', e.e_data) AS data, s.ord AS so, 0 AS part, e.ord AS eo "
        "FROM e JOIN m ON m.uid = e.e_uid JOIN s ON s.uid = e.e_uid "
        "UNION ALL SELECT xs.x_type, s.now, xs.x_kind, xs.x_subject, xs.x_data, s.ord, 1, xs.ord "
        "FROM xs JOIN m ON m.uid = xs.x_uid JOIN s ON s.uid = xs.x_uid) AS q ORDER BY q.so, q.part, q.eo), "
        "o AS (INSERT INTO machine_operations (namespace, machine_id, key, kind, status_code, body, created_at) "
        "SELECT s.namespace, s.id, s.op_key, s.op_kind, s.op_status, s.op_body, s.now FROM s JOIN m ON m.uid = s.uid "
        "WHERE s.op_key IS NOT NULL)"
        f"{wake}"
        "SELECT target.uid IS NOT NULL, m.uid IS NOT NULL FROM s LEFT JOIN target ON target.uid = s.uid "
        "LEFT JOIN m ON m.uid = s.uid"
        + (" WHERE (SELECT count(*) FROM wake) >= 0" if alone else "")
        + " ORDER BY s.ord"
    )


_STEPS_WAITING = _steps_cte("", alone=False)
_STEPS_SKIPPING = _steps_cte(" SKIP LOCKED", alone=False)
_STEPS_SKIPPING_ALONE = _steps_cte(" SKIP LOCKED", alone=True)


def _json(value: object) -> str | None:
    return None if value is None else json.dumps(value)


async def write_steps_with_events(
    tx: Transaction, steps: Sequence[StepRows], *, grouped: bool, wake: Sequence[str] = (), more: bool = False
) -> list[Applied]:
    """PostgreSQL: ``write_step`` of each step with its history rows, events and operation, all in one
    statement; per step, in order, how it ended. A machine that appears twice is written once: its later
    steps answer ``LOCKED`` (applied alone afterwards, where the version guard decides). ``wake``: the channels
    the caller notifies once applied; ``more``: the caller writes more in ``tx`` after this (otherwise, in a
    transaction that may run alone, this statement is all of it, and sends ``wake`` itself)."""
    first_of: dict[int, int] = {}
    for i, rows in enumerate(steps):
        first_of.setdefault(rows.step.uid, i)
    sent = sorted(first_of.values())
    params: dict[str, list[object]] = {name: [] for name, _ in (*_STEPS_UNNEST, *_EVENTS_UNNEST, *_ANNOUNCE_UNNEST)}
    any_events = False
    extra: list[str] = []
    for i in sent:
        rows, step = steps[i], steps[i].step
        machine, op = rows.machine, rows.operation
        for name, value in (
            ("uid", step.uid), ("version", step.version), ("last_event_id", step.last_event_id), ("aux_state", _json(step.aux_state)),
            ("timer_at", step.timer_at), ("retry_attempt", step.retry_attempt), ("retry_since", step.retry_since),
            ("status", step.status), ("error", _json(step.error)), ("now", step.updated_at), ("timer_range", _json(step.timer_range)),
            ("timer_timeout_ms", step.timer_timeout_ms), ("subject", machine.subject), ("namespace", machine.namespace),
            ("id", machine.id), ("op_key", None if op is None else op.key), ("op_kind", None if op is None else op.kind),
            ("op_status", None if op is None else op.status_code), ("op_body", None if op is None else _json(op.body)),
            ("lease_token", step.lease_token), ("lease_expires_at", step.lease_expires_at),
        ):
            params[name].append(value)
        for n, event in enumerate(rows.events):
            params["e_uid"].append(step.uid)
            params["e_event_id"].append(machine.last_event_id + 1 + n)
            params["e_data"].append(json.dumps(event))
            any_events = True
        for kind, subject_kind, subject_id, data in rows.announce:
            params["x_uid"].append(step.uid)
            params["x_type"].append(kind)
            params["x_kind"].append(subject_kind)
            params["x_subject"].append(subject_id)
            params["x_data"].append(json.dumps(data))
            any_events = True
        extra.extend(c for c in rows.channels if c not in extra and c not in wake)
    channels = [SEQUENCER_CHANNEL, *wake, *extra] if any_events else [*wake, *extra]
    # Straight on asyncpg (``fetch``): SQLAlchemy's execution and result layers cost about as much as the rest.
    if grouped and not more and tx.may_run_alone:
        answer = await tx.fetch_alone(_STEPS_SKIPPING_ALONE, {**params, "pg_channel": PG_CHANNEL, "channels": channels})
    else:
        answer = await tx.fetch(_STEPS_SKIPPING if grouped else _STEPS_WAITING, params)
    outcomes = [Applied.LOCKED] * len(steps)
    for i, (taken, applied) in zip(sent, answer.all(), strict=True):
        outcomes[i] = Applied.APPLIED if applied else Applied.MOVED_ON if taken else Applied.LOCKED
    if Applied.APPLIED in outcomes:
        for channel in channels:
            tx.notify(channel)
    return outcomes


@dataclass(frozen=True, slots=True)
class NewMachine:
    """A driven machine to create with its first history events and the outbox events of its creation
    (``machine.created``, one ``machine.event`` per history event, then ``announce``: a face's own)."""

    namespace: str
    id: str
    aux_state: JsonData
    timer_at: int | None
    lease: tuple[str, int] | None
    events: Sequence[JsonData]
    now: int
    announce: Sequence[tuple[str, str, str, object]] = ()
    """(type, subject kind, subject id, data) of each further event, written after the machine's own."""


_NEW_UNNEST = (
    ("namespace", "text"), ("id", "text"), ("aux_state", "jsonb"), ("timer_at", "bigint"), ("lease_token", "text"),
    ("lease_expires_at", "bigint"), ("now", "bigint"), ("last_event_id", "integer"),
)
_NEW_HISTORY_UNNEST = (("h_of", "bigint"), ("h_event_id", "integer"), ("h_data", "jsonb"))
_NEW_EVENTS_UNNEST = (("x_of", "bigint"), ("x_type", "text"), ("x_kind", "text"), ("x_subject", "text"), ("x_data", "jsonb"))


def _create_cte(alone: bool) -> TextClause:
    """PostgreSQL: new machines with their history rows and outbox events in one statement. A (namespace, id)
    that exists is skipped (``ON CONFLICT DO NOTHING``): the answer gives per new machine, in order, its uid or
    NULL. ``alone``: the statement is its whole transaction (autocommit) and sends its wake-ups itself."""
    wake = (
        ", wake AS (SELECT pg_notify(:pg_channel, channel) FROM unnest(CAST(:channels AS text[])) AS channel "
        "WHERE EXISTS (SELECT 1 FROM m)) "
        if alone else " "
    )
    return text(
        f"WITH r AS ({_unnest(_NEW_UNNEST, 'r')}), "
        "m AS (INSERT INTO machines (namespace, id, status, version, last_event_id, aux_state, timer_at, notify_at, wake_at, "
        "retry_attempt, retry_since, lease_token, lease_expires_at, error, created_at, updated_at, timer_range, timer_timeout_ms) "
        "SELECT r.namespace, r.id, 'working', 1, r.last_event_id, r.aux_state, r.timer_at, NULL, r.timer_at, 0, NULL, "
        "r.lease_token, r.lease_expires_at, NULL, r.now, r.now, NULL, NULL FROM r ORDER BY r.ord "
        "ON CONFLICT (namespace, id) DO NOTHING RETURNING uid, namespace, id), "
        "k AS (SELECT r.ord, r.now, m.uid FROM r JOIN m ON m.namespace = r.namespace AND m.id = r.id), "
        f"hs AS ({_unnest(_NEW_HISTORY_UNNEST, 'hs')}), "
        "h AS (INSERT INTO machine_history (machine_uid, event_id, created_at, data) "
        "SELECT k.uid, hs.h_event_id, k.now, hs.h_data FROM hs JOIN k ON k.ord = hs.h_of), "
        f"xs AS ({_unnest(_NEW_EVENTS_UNNEST, 'xs')}), "
        "ev AS (INSERT INTO events (type, at, subject_kind, subject_id, data) "
        "SELECT xs.x_type, k.now, xs.x_kind, xs.x_subject, xs.x_data FROM xs JOIN k ON k.ord = xs.x_of ORDER BY xs.ord)"
        f"{wake}"
        "SELECT k.uid FROM r LEFT JOIN k ON k.ord = r.ord"
        + (" WHERE (SELECT count(*) FROM wake) >= 0" if alone else "")
        + " ORDER BY r.ord"
    )


_CREATE = _create_cte(alone=False)
_CREATE_ALONE = _create_cte(alone=True)


async def create_machines_with_events(tx: Transaction, new: Sequence[NewMachine], wake: Sequence[str] = ()) -> list[MachineRow | None]:
    """PostgreSQL: ``new`` machines, each with its history rows and events, in one statement (the whole
    transaction when it may run alone: one round trip); per machine, in order, the row created or None when its
    (namespace, id) was taken (by an earlier machine of ``new`` too). ``wake``: channels to notify once created."""
    first: dict[tuple[str, str], int] = {}
    for i, machine in enumerate(new):
        first.setdefault((machine.namespace, machine.id), i)
    sent = sorted(first.values())
    params: dict[str, list[object]] = {name: [] for name, _ in (*_NEW_UNNEST, *_NEW_HISTORY_UNNEST, *_NEW_EVENTS_UNNEST)}
    for ord_, i in enumerate(sent, start=1):
        m = new[i]
        subject = machine_subject(m.namespace, m.id)
        for name, value in (
            ("namespace", m.namespace), ("id", m.id), ("aux_state", _json(m.aux_state)), ("timer_at", m.timer_at),
            ("lease_token", None if m.lease is None else m.lease[0]), ("lease_expires_at", None if m.lease is None else m.lease[1]),
            ("now", m.now), ("last_event_id", len(m.events)),
        ):
            params[name].append(value)
        outbox_rows: list[tuple[str, str, str, object]] = [("machine.created", "machine", subject, {"namespace": m.namespace, "id": m.id})]
        for n, event in enumerate(m.events, start=1):
            params["h_of"].append(ord_)
            params["h_event_id"].append(n)
            params["h_data"].append(json.dumps(event))
            outbox_rows.append(("machine.event", "machine", subject, {"namespace": m.namespace, "id": m.id, "event_id": n, "data": event}))
        outbox_rows.extend(m.announce)
        for kind, subject_kind, subject_id, data in outbox_rows:
            params["x_of"].append(ord_)
            params["x_type"].append(kind)
            params["x_kind"].append(subject_kind)
            params["x_subject"].append(subject_id)
            params["x_data"].append(json.dumps(data))
    channels = [SEQUENCER_CHANNEL, *wake]
    if tx.may_run_alone:
        answer = await tx.fetch_alone(_CREATE_ALONE, {**params, "pg_channel": PG_CHANNEL, "channels": channels})
    else:
        answer = await tx.fetch(_CREATE, params)
    created: list[MachineRow | None] = [None] * len(new)
    for i, (uid,) in zip(sent, answer.all(), strict=True):
        if uid is None:
            continue
        m = new[i]
        created[i] = MachineRow(
            uid, m.namespace, m.id, "working", 1, len(m.events), m.aux_state, m.timer_at, None, m.timer_at, 0, None,
            None if m.lease is None else m.lease[0], None if m.lease is None else m.lease[1], None, m.now, m.now, None, None,
        )
    if any(c is not None for c in created):
        for channel in channels:
            tx.notify(channel)
    return created


async def write_step(tx: Transaction, step: StepWrite) -> Applied:
    """SQLite: write the machine row of a step, guarded by the version it read; the lease ends with it. (One
    writer at a time, so nothing is ever held by another transaction; PostgreSQL uses
    ``write_step_with_events``.)"""
    result = await tx.execute(_APPLY_STEP, _step_params(step))
    return Applied.APPLIED if result.rowcount else Applied.MOVED_ON


_FAIL = (
    machines.update()
    .where(machines.c.uid == bindparam("b_uid"), machines.c.version == bindparam("b_version"))
    .values(status="failed", error=bindparam("b_error", type_=machines.c.error.type), version=bindparam("b_version") + 1,
            updated_at=bindparam("b_now"), **leases.released())
)
_REPAIRED = (
    machines.update()
    .where(machines.c.uid == bindparam("b_uid"), machines.c.version == bindparam("b_version"))
    .values(status="working", error=null(), version=bindparam("b_version") + 1, retry_attempt=0, retry_since=null(), updated_at=bindparam("b_now"))
)


async def fail_machine(tx: Transaction, machine: MachineRow, error: JsonObject, now: int) -> bool:
    """Turn the machine ``failed`` while it is still at the version read; False if it moved on."""
    result = await tx.execute(_FAIL, {"b_uid": machine.uid, "b_version": machine.version, "b_error": error, "b_now": now})
    return bool(result.rowcount)


async def mark_repaired(tx: Transaction, machine: MachineRow, now: int) -> bool:
    """A failed machine ``working`` again (a simple repair), guarded by its version."""
    result = await tx.execute(_REPAIRED, {"b_uid": machine.uid, "b_version": machine.version, "b_now": now})
    return bool(result.rowcount)


async def delete_machine(tx: Transaction, machine: MachineRow) -> None:
    """Remove a machine with its history, pending notifications, journal and operations."""
    for table, column in ((history, history.c.machine_uid), (notifications, notifications.c.machine_uid), (failures, failures.c.machine_uid)):
        await tx.execute(delete(table).where(column == machine.uid))
    await tx.execute(delete(operations).where(operations.c.namespace == machine.namespace, operations.c.machine_id == machine.id))
    await tx.execute(delete(machines).where(machines.c.uid == machine.uid))


# --- background: leases on due machines -------------------------------------------------------------------

DEFAULT_TIMEOUT_MS = 30_000


@dataclass(frozen=True, slots=True)
class LeasedBatch:
    """Due machines as leased, earliest due first, with the stored row of each one's namespace (None: not stored,
    as read with the lease)."""

    machines: list[MachineRow]
    namespaces: dict[str, NamespaceRow | None]


async def lease_due(tx: Transaction, now: int, due_by: int, limit: int, token: str, margin_ms: int,
                    only: Sequence[str] | None = None) -> LeasedBatch:
    """Lease up to ``limit`` free working machines due by ``due_by`` (skipping rows other transactions hold),
    each for its namespace's processor timeout plus ``margin_ms``; answers them with their namespaces' rows.
    On PostgreSQL one statement (in a transaction that may run alone, one round trip) that also reads the
    namespaces; SQLite, whose UPDATE cannot be a CTE, reads them with a second one in the same transaction."""
    key = (tx.store.dialect.name, only is not None)
    statement = _LEASE_DUE.get(key)
    if statement is None:
        statement = _LEASE_DUE[key] = _lease_due(tx.store.dialect, with_namespaces=tx.store.is_postgres, only=only is not None)
    params = {"now": now, "due_by": due_by, "limit": limit, "token": token, "expires_base": now + margin_ms}
    if only is not None:
        params["only"] = sorted(only)
    rows = (await (tx.execute_alone(statement, params) if tx.may_run_alone else tx.execute(statement, params))).all()
    leased = sorted((_machine(r) for r in rows), key=lambda m: (m.wake_at, m.uid))
    stored: dict[str, NamespaceRow | None] = dict.fromkeys((m.namespace for m in leased), None)
    if tx.store.is_postgres:
        stored.update((r[_MACHINE_WIDTH], _namespace(r[_MACHINE_WIDTH:])) for r in rows if r[_MACHINE_WIDTH] is not None)
    elif stored:
        stored.update((r.name, _namespace(r)) for r in (await tx.execute(_NAMESPACES_NAMED, {"names": sorted(stored)})).all())
    return LeasedBatch(leased, stored)


_LEASE_DUE: dict[tuple[str, bool], Executable] = {}
_NAMESPACES_NAMED = select(namespaces).where(namespaces.c.name.in_(bindparam("names", expanding=True)))


def _lease_due(dialect: Backend, *, with_namespaces: bool, only: bool = False) -> Executable:
    base = bindparam("expires_base", type_=machines.c.timer_at.type)  # bigint, not int32
    timeout_ms = select(namespaces.c.timeout_ms).where(namespaces.c.name == machines.c.namespace).scalar_subquery()
    expires = base + func.coalesce(timeout_ms, DEFAULT_TIMEOUT_MS)
    # A timer with its own, longer timeout (Machinegun's SetTimerAction.timeout) holds its machine that long.
    own = base + machines.c.timer_timeout_ms
    expires = case((and_(machines.c.timer_timeout_ms.is_not(None), own > expires), own), else_=expires)
    now = bindparam("now", type_=machines.c.timer_at.type)
    due = (
        select(machines.c.uid)
        .where(machines.c.status == "working", machines.c.wake_at <= bindparam("due_by", type_=machines.c.wake_at.type), leases.free(machines, now))
        .order_by(machines.c.wake_at)
        .limit(bindparam("limit"))
    )
    if only:
        due = due.where(machines.c.namespace.in_(bindparam("only", expanding=True)))
    picked = picked_once(dialect, due, "due")
    where = machines.c.uid.in_(select(picked.c.uid))
    taking = leases.taking(machines, where, bindparam("token", type_=machines.c.lease_token.type), now, expires).returning(*machines.c)
    if not with_namespaces:
        return taking
    leased = taking.cte("leased")
    return select(leased, namespaces).select_from(leased.outerjoin(namespaces, namespaces.c.name == leased.c.namespace))


_NEXT_WAKE = select(
    func.min(case((machines.c.lease_expires_at > machines.c.wake_at, machines.c.lease_expires_at), else_=machines.c.wake_at))
).where(machines.c.status == "working", machines.c.wake_at.is_not(None))


async def next_wake(conn: Executor) -> int | None:
    """When a machine is next due (or its lease next runs out)."""
    value = (await conn.execute(_NEXT_WAKE)).scalar()
    return None if value is None else int(value)


_BY_UID = machines.c.uid == bindparam("b_uid")


async def release(tx: Transaction, uid: int, token: str) -> None:
    """End a lease still held with ``token`` (nothing if it was ended or taken over since)."""
    await tx.execute(_RELEASE, {"b_uid": uid, "b_token": token})


_HELD = leases.held(machines, bindparam("b_token"))  # type: ignore[arg-type]
_RELEASE = machines.update().where(_BY_UID, _HELD).values(**leases.released())
_RETRY_TIMER = (
    machines.update()
    .where(_BY_UID, machines.c.version == bindparam("b_version"), _HELD)
    .values(
        timer_at=bindparam("b_retry_at", type_=machines.c.timer_at.type),
        retry_attempt=bindparam("b_attempts"),
        retry_since=bindparam("b_since", type_=machines.c.retry_since.type),
        wake_at=case((machines.c.notify_at < bindparam("b_retry_at", type_=machines.c.timer_at.type), machines.c.notify_at), else_=bindparam("b_retry_at", type_=machines.c.timer_at.type)),
        **leases.released(),
    )
)
_RELEASE_AT_VERSION = machines.update().where(_BY_UID, machines.c.version == bindparam("b_version"), _HELD).values(**leases.released())


async def retry_timer_later(tx: Transaction, machine: MachineRow, retry_at: int, attempts: int, since: int) -> bool:
    """Move a failed timer to ``retry_at`` and end the lease, while the machine is as read and still leased."""
    params = {"b_uid": machine.uid, "b_version": machine.version, "b_token": machine.lease_token, "b_retry_at": retry_at, "b_attempts": attempts, "b_since": since}
    return bool((await tx.execute(_RETRY_TIMER, params)).rowcount)


async def release_at_version(tx: Transaction, machine: MachineRow) -> bool:
    """End the lease while the machine is as read and still leased by us."""
    return bool((await tx.execute(_RELEASE_AT_VERSION, {"b_uid": machine.uid, "b_version": machine.version, "b_token": machine.lease_token})).rowcount)


# --- driven machines (the workflows layer's runs) ---------------------------------------------------------

_EXTEND_LEASE = (
    machines.update().where(_BY_UID, _HELD).values(lease_expires_at=bindparam("b_expires", type_=machines.c.lease_expires_at.type))
)


async def extend_leases(tx: Transaction, leased: Sequence[tuple[int, str, int]]) -> set[int]:
    """Move the expiry of each (uid, token, expires) lease still held with that token; answers the uids whose
    lease was still held (a version does not change: a lease is not a step)."""
    kept: set[int] = set()
    for uid, token, expires in leased:
        if (await tx.execute(_EXTEND_LEASE, {"b_uid": uid, "b_token": token, "b_expires": expires})).rowcount:
            kept.add(uid)
    return kept


_TAKE_AT_VERSION = (
    machines.update()
    .where(_BY_UID, machines.c.version == bindparam("b_version"), machines.c.status == "working")
    .where(leases.free(machines, bindparam("b_now", type_=machines.c.lease_expires_at.type)))
    .values(lease_token=bindparam("b_token"), lease_expires_at=bindparam("b_expires", type_=machines.c.lease_expires_at.type))
)


async def take_at_version(tx: Transaction, uid: int, version: int, token: str, now: int, expires: int) -> bool:
    """Lease a working machine nobody holds while it is still at ``version``."""
    params = {"b_uid": uid, "b_version": version, "b_token": token, "b_now": now, "b_expires": expires}
    return bool((await tx.execute(_TAKE_AT_VERSION, params)).rowcount)


_RANKED_NOTIFICATIONS = select(
    notifications, func.row_number().over(partition_by=notifications.c.machine_uid, order_by=notifications.c.seq).label("rank")
).where(notifications.c.machine_uid.in_(bindparam("uids", expanding=True))).subquery()
_NOTIFICATIONS_OF_MANY = (
    select(*(_RANKED_NOTIFICATIONS.c[c.name] for c in notifications.c))
    .where(_RANKED_NOTIFICATIONS.c.rank <= bindparam("limit"))
    .order_by(_RANKED_NOTIFICATIONS.c.machine_uid, _RANKED_NOTIFICATIONS.c.seq)
)


async def notifications_of_many(conn: Executor, uids: Sequence[int], limit: int) -> dict[int, list[NotificationRow]]:
    """The oldest ``limit`` pending notifications of each of these machines, in order, in one query."""
    found: dict[int, list[NotificationRow]] = {uid: [] for uid in uids}
    if found:
        for r in (await conn.execute(_NOTIFICATIONS_OF_MANY, {"uids": sorted(found), "limit": limit})).all():
            found[r.machine_uid].append(NotificationRow(*r))
    return found


async def delete_notifications(tx: Transaction, uid: int, seqs: Sequence[int]) -> None:
    """Delete delivered notifications of a machine (whose row ``tx`` holds) and point ``notify_at`` at what is left."""
    if seqs:
        await tx.execute(delete(notifications).where(notifications.c.seq.in_(sorted(seqs))))
        await refresh_notify_at(tx, uid)


async def machines_by_uid(conn: Executor, uids: Sequence[int]) -> list[MachineRow]:
    if not uids:
        return []
    return [_machine(r) for r in (await conn.execute(select(machines).where(machines.c.uid.in_(sorted(set(uids)))))).all()]


def _aux(key: str) -> ColumnElement[str]:
    return machines.c.aux_state[key].as_string()


async def list_by_aux(conn: Executor, namespace: str, key: str, value: str | None, after_id: str | None, limit: int) -> list[MachineRow]:
    """A namespace's machines in id order whose aux state's ``key`` is ``value`` (None: any)."""
    query = select(machines).where(machines.c.namespace == namespace)
    if value is not None:
        query = query.where(_aux(key) == value)
    if after_id is not None:
        query = query.where(machines.c.id > after_id)
    return [_machine(r) for r in (await conn.execute(query.order_by(machines.c.id).limit(limit))).all()]


async def count_by_aux(conn: Executor, namespace: str, key: str) -> dict[str | None, int]:
    """A namespace's machines counted by their aux state's ``key``."""
    value = _aux(key)
    rows = (await conn.execute(select(value, func.count()).where(machines.c.namespace == namespace).group_by(value))).all()
    return {r[0]: int(r[1]) for r in rows}


async def first_events(conn: Executor, uids: Sequence[int]) -> dict[int, JsonData]:
    """The data of each machine's first history event."""
    if not uids:
        return {}
    rows = (await conn.execute(select(history.c.machine_uid, history.c.data).where(history.c.machine_uid.in_(sorted(set(uids))), history.c.event_id == 1))).all()
    return {r[0]: r[1] for r in rows}


__all__ = ["Applied", "FailureRow", "HistoryRow", "MachineRow", "NamespaceRow", "NotificationRow", "OperationRow", "StepRows", "StepWrite"]
