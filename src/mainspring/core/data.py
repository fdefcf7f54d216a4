"""Every statement of the core: the outbox, alerts, API tokens and publisher cursors.

Statements used on every request are built once (module constants) so SQLAlchemy finds them in its compiled
cache without rebuilding them; functions answer typed records, never rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, bindparam, column, func, or_, select, text, true

from mainspring.core import leases
from mainspring.core.tables import (
    EVENTS_PER_MINUTE,
    MINUTE_MS,
    alerts,
    api_tokens,
    event_counts,
    events,
    publisher_cursors,
)
from mainspring.store import Store, Transaction
from mainspring.store import counts as kept_counts
from mainspring.store.dialect import Executor
from mainspring.types import JsonInput, JsonObject


@dataclass(frozen=True, slots=True)
class Event:
    """An event to write: ``type`` happened to the subject ``(subject_kind, subject_id)``."""

    type: str
    subject_kind: str
    subject_id: str
    data: Mapping[str, JsonInput]


@dataclass(frozen=True, slots=True)
class StoredEvent:
    position: int
    type: str
    at: int
    subject_kind: str
    subject_id: str
    data: JsonObject


@dataclass(frozen=True, slots=True)
class Alert:
    id: str
    at: int
    severity: str
    code: str
    subject_kind: str
    subject_id: str
    detail: str
    acked_at: int | None
    resolved_at: int | None = None
    resolved_by: str | None = None
    resolution: str | None = None

    @property
    def is_open(self) -> bool:
        """Nobody acknowledged it and its subject was not found fixed."""
        return self.acked_at is None and self.resolved_at is None


@dataclass(frozen=True, slots=True)
class Token:
    id: str
    name: str
    token_sha256: str
    scopes: list[str]
    created_at: int
    revoked_at: int | None


RFC3339_SQL = (
    "(to_char(to_timestamp((({ms}) - ((({ms}) % 1000 + 1000) % 1000)) / 1000) AT TIME ZONE 'UTC', "
    "'YYYY-MM-DD\"T\"HH24:MI:SS') || '.' || lpad(((({ms}) % 1000 + 1000) % 1000)::text, 3, '0') || 'Z')"
)
"""PostgreSQL: epoch milliseconds ``{ms}`` as the API writes times (``store.format_time``), for events built in
SQL from the rows a statement wrote; NULL stays NULL."""


# --- the outbox ---------------------------------------------------------------------------------------

# SQLite: one writer, so the inserting statement numbers the batch itself, on from the highest position, in
# the batch's order; the events come as one JSON list of [type, kind, subject, data as JSON text] (one
# statement and one parameter, however many: an executemany of one row each cost ~25 µs of Python per event).
# SQLite reads the whole SELECT before it inserts (it reads the table it writes), so every row sees the same
# highest position.
_INSERT_NUMBERED_EVENTS_SQLITE = text(
    "INSERT INTO events (position, type, at, subject_kind, subject_id, data) "
    "SELECT (SELECT coalesce(max(position), 0) FROM events) + e.key + 1, json_extract(e.value, '$[0]'), :at, "
    "json_extract(e.value, '$[1]'), json_extract(e.value, '$[2]'), json_extract(e.value, '$[3]') "
    "FROM json_each(:rows) AS e ORDER BY e.key"
)


async def insert_events(tx: Transaction, store: Store, batch: Sequence[Event], at: int) -> None:
    """Insert ``batch``, numbered (SQLite; on PostgreSQL ``insert_numbered_events``, as a transaction's last
    statement)."""
    if store.is_postgres:
        await insert_numbered_events(tx, [(e, at) for e in batch])
        return
    if not batch:
        return
    rows = json.dumps([[e.type, e.subject_kind, e.subject_id, json.dumps(e.data)] for e in batch])
    await tx.execute(_INSERT_NUMBERED_EVENTS_SQLITE, {"rows": rows, "at": at})


# PostgreSQL: any number of events in one statement; each row's position comes from the column's default
# (migration core_0006: the numbering lock, then the next number), taken in the order given.
_INSERT_EVENTS = text(
    "INSERT INTO events (type, at, subject_kind, subject_id, data) "
    "SELECT e.type, e.at, e.kind, e.subject, e.data FROM unnest(CAST(:types AS text[]), CAST(:ats AS bigint[]), "
    "CAST(:kinds AS text[]), CAST(:subjects AS text[]), CAST(:data AS jsonb[])) "
    "WITH ORDINALITY AS e(type, at, kind, subject, data, n) ORDER BY e.n"
)


async def insert_numbered_events(tx: Transaction, batch: Sequence[tuple[Event, int]]) -> None:
    """Insert each (event, at) of ``batch`` in order, numbered by the store as it writes them (PostgreSQL):
    the numbering lock is held from here until the transaction ends, so this is its last statement."""
    # Every write with events runs this: prepared once on the connection, without SQLAlchemy's per-call work.
    await tx.fetch(_INSERT_EVENTS, event_columns(batch))


_INSERT_EVENTS_AT_COMMIT = text(str(_INSERT_EVENTS).replace("INSERT INTO events ", "INSERT INTO events_at_commit ", 1))


async def insert_events_at_commit(tx: Executor, batch: Sequence[tuple[Event, int]]) -> None:
    """Stage each (event, at) of ``batch``, in order, to be moved into ``events`` and numbered when the
    transaction commits (PostgreSQL, a caller's own transaction: migration interactions_0017)."""
    await tx.execute(_INSERT_EVENTS_AT_COMMIT, event_columns(batch))


def event_columns(batch: Sequence[tuple[Event, int]]) -> dict[str, list[object]]:
    """The parameters ``types``, ``ats``, ``kinds``, ``subjects`` and ``data`` of an events insert (``_INSERT_EVENTS``, or a
    face's statement that writes its events as part of its last statement)."""
    return {
        "types": [e.type for e, _ in batch], "ats": [at for _, at in batch], "kinds": [e.subject_kind for e, _ in batch],
        "subjects": [e.subject_id for e, _ in batch], "data": [json.dumps(e.data) for e, _ in batch],
    }


async def head_position(conn: Executor) -> int:
    return int((await conn.execute(select(func.coalesce(func.max(events.c.position), 0)))).scalar_one())


def _stored(row: Any) -> StoredEvent:
    return StoredEvent(row.position, row.type, row.at, row.subject_kind, row.subject_id, row.data)


async def events_after(
    conn: Executor, after: int, limit: int, types: Sequence[str] = (), prefixes: Sequence[str] = ()
) -> tuple[list[StoredEvent], int | None]:
    """Numbered events after ``after``, oldest first, and — when filtered by type — the top position the
    scan covered (read first: under READ COMMITTED an event numbered between two statements must not be
    jumped over)."""
    query = select(events).where(events.c.position > after).order_by(events.c.position).limit(limit)
    if not types and not prefixes:
        return [_stored(r) for r in (await conn.execute(query)).all()], None
    clauses = [events.c.type.in_(types)] if types else []
    clauses.extend(events.c.type.startswith(p, autoescape=True) for p in prefixes)
    top = int((await conn.execute(select(func.coalesce(func.max(events.c.position), after)))).scalar_one())
    rows = (await conn.execute(query.where(or_(*clauses), events.c.position <= top))).all()
    return [_stored(r) for r in rows], top


async def delete_events_before(tx: Executor, before_ms: int, batch: int, up_to_position: int | None = None) -> int:
    """Delete up to ``batch`` numbered events older than ``before_ms`` (and at or below ``up_to_position``,
    what every publisher has passed). The newest event always stays: SQLite numbers the next one from it."""
    newest = select(func.max(events.c.position)).scalar_subquery()
    old = select(events.c.id).where(events.c.at < before_ms, events.c.position < newest)
    if up_to_position is not None:
        old = old.where(events.c.position <= up_to_position)
    # Oldest first on ``ix_events_at``: the walk stops after ``batch``, and finds nothing at once when nothing
    # is due (without it the plan was a Seq Scan and a sort of the whole table, every round: the soak).
    old = old.order_by(events.c.at).limit(batch)
    return (await tx.execute(events.delete().where(events.c.id.in_(old.scalar_subquery())))).rowcount or 0


async def lowest_cursor(conn: Executor, names: Sequence[str]) -> int:
    """The position every one of these publishers has passed (0 for one that never published)."""
    positions = dict((await conn.execute(select(publisher_cursors.c.name, publisher_cursors.c.position).where(
        publisher_cursors.c.name.in_(list(names))))).tuples().all())
    return min(int(positions.get(name, 0)) for name in names)


# --- alerts -------------------------------------------------------------------------------------------


def _alert(row: Any) -> Alert:
    return Alert(row.id, row.at, row.severity, row.code, row.subject_kind, row.subject_id, row.detail, row.acked_at,
                 row.resolved_at, row.resolved_by, row.resolution)


_OPEN = alerts.c.acked_at.is_(None) & alerts.c.resolved_at.is_(None)


# PostgreSQL: one index probe per id asked about (LATERAL … LIMIT 1 leaves the planner no other plan). Start-up
# recovery asks about 500 subjects at a time while it raises their alerts, so the table grows faster than its
# statistics: ``subject_id = ANY(array)`` was planned as a scan of every alert of the code, and its generic
# plan (the statement is prepared) took ~300 ms a call at 25,000 alerts — 9 s of a 100,000-process recovery.
_OPEN_ALERT_SUBJECTS_PG = text(
    "SELECT w.subject_id FROM unnest(CAST(:subject_ids AS varchar[])) AS w(subject_id) CROSS JOIN LATERAL"
    " (SELECT 1 FROM alerts AS a WHERE a.code = :code AND a.subject_kind = :subject_kind"
    " AND a.subject_id = w.subject_id AND a.acked_at IS NULL AND a.resolved_at IS NULL LIMIT 1) AS open"
)


async def open_alert_subjects(tx: Transaction, code: str, subject_kind: str, subject_ids: Iterable[str]) -> set[str]:
    """Which of ``subject_ids`` already have an open alert of ``code``: one statement on PostgreSQL, the ids
    one array parameter."""
    wanted = list(subject_ids)
    if tx.store.is_postgres:
        params = {"subject_ids": wanted, "code": code, "subject_kind": subject_kind}
        return set((await tx.execute(_OPEN_ALERT_SUBJECTS_PG, params)).scalars())
    found: set[str] = set()
    for start in range(0, len(wanted), 1000):
        query = select(alerts.c.subject_id).where(
            alerts.c.code == code,
            alerts.c.subject_kind == subject_kind,
            tx.store.dialect.any_of(alerts.c.subject_id, wanted[start : start + 1000]),
            _OPEN,
        )
        found |= set((await tx.execute(query)).scalars())
    return found


async def insert_alerts(tx: Executor, rows: Sequence[Alert]) -> None:
    await tx.execute(
        alerts.insert(),
        [
            {"id": a.id, "at": a.at, "severity": a.severity, "code": a.code, "subject_kind": a.subject_kind,
             "subject_id": a.subject_id, "detail": a.detail, "acked_at": a.acked_at}
            for a in rows
        ],
    )


async def get_alert(conn: Executor, alert_id: str) -> Alert | None:
    row = (await conn.execute(select(alerts).where(alerts.c.id == alert_id))).first()
    return None if row is None else _alert(row)


async def ack_alert(tx: Executor, alert_id: str, at: int) -> None:
    await tx.execute(alerts.update().where(alerts.c.id == alert_id, alerts.c.acked_at.is_(None)).values(acked_at=at))


async def count_open_alerts(conn: Executor) -> dict[str, int]:
    """Open alerts counted by code."""
    rows = (await conn.execute(select(alerts.c.code, func.count()).where(_OPEN).group_by(alerts.c.code))).all()
    return {str(code): int(n) for code, n in rows}


async def open_alerts_of(conn: Executor, codes: Iterable[str], limit: int, after: tuple[int, str] | None = None) -> list[Alert]:
    """Open alerts with one of ``codes``, oldest first, keyset-paged by (at, id) (what the closer checks)."""
    query = select(alerts).where(_OPEN, alerts.c.code.in_(sorted(set(codes)))).order_by(alerts.c.at, alerts.c.id).limit(limit)
    if after is not None:
        query = query.where((alerts.c.at > after[0]) | ((alerts.c.at == after[0]) & (alerts.c.id > after[1])))
    return [_alert(r) for r in (await conn.execute(query)).all()]


async def resolve_alert(tx: Executor, alert_id: str, at: int, by: str, why: str) -> bool:
    """Close an unresolved alert; False when it was closed already (by another server, say)."""
    statement = alerts.update().where(alerts.c.id == alert_id, alerts.c.resolved_at.is_(None)).values(resolved_at=at, resolved_by=by, resolution=why)
    return bool((await tx.execute(statement)).rowcount)


async def list_alerts(conn: Executor, *, open_only: bool, limit: int, before: tuple[int, str] | None) -> list[Alert]:
    """Newest first; ``before`` is the (at, id) keyset position to continue after."""
    query = select(alerts).order_by(alerts.c.at.desc(), alerts.c.id.desc()).limit(limit)
    if open_only:
        query = query.where(_OPEN)
    if before is not None:
        at, alert_id = before
        query = query.where((alerts.c.at < at) | ((alerts.c.at == at) & (alerts.c.id < alert_id)))
    return [_alert(r) for r in (await conn.execute(query)).all()]


# --- API tokens ---------------------------------------------------------------------------------------


def _token(row: Any) -> Token:
    return Token(row.id, row.name, row.token_sha256, list(row.scopes), row.created_at, row.revoked_at)


async def active_tokens(conn: Executor) -> list[Token]:
    return [_token(r) for r in (await conn.execute(select(api_tokens).where(api_tokens.c.revoked_at.is_(None)))).all()]


async def any_token_stored(conn: Executor) -> bool:
    """Whether a token was ever stored, revoked ones included (a store that has had tokens stays closed)."""
    return (await conn.execute(select(api_tokens.c.id).limit(1))).first() is not None


async def all_tokens(conn: Executor) -> list[Token]:
    return [_token(r) for r in (await conn.execute(select(api_tokens).order_by(api_tokens.c.created_at))).all()]


async def insert_token(tx: Executor, token: Token) -> None:
    await tx.execute(
        api_tokens.insert().values(
            id=token.id, name=token.name, token_sha256=token.token_sha256, scopes=token.scopes, created_at=token.created_at
        )
    )


async def revoke_token(tx: Executor, token_id: str, at: int) -> bool:
    result = await tx.execute(
        api_tokens.update().where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None)).values(revoked_at=at)
    )
    return bool(result.rowcount)


# --- publisher cursors --------------------------------------------------------------------------------

_CURSOR_POSITION = select(publisher_cursors.c.position).where(publisher_cursors.c.name == bindparam("name"))


async def lease_cursor(tx: Executor, store: Store, name: str, token: str, now: int, lease_ms: int) -> int | None:
    """Take the publisher cursor ``name`` (created at 0 on first use); its position, or None while another
    server holds it."""
    await tx.execute(
        store.dialect.insert(publisher_cursors)
        .values(name=name, position=0, updated_at=now)
        .on_conflict_do_nothing(index_elements=["name"])
    )
    mine_or_free = or_(leases.held(publisher_cursors, token), leases.free(publisher_cursors, now))
    taken = await tx.execute(
        publisher_cursors.update()
        .where(publisher_cursors.c.name == name, mine_or_free)
        .values(lease_token=token, lease_expires_at=now + lease_ms)
    )
    if not taken.rowcount:
        return None
    return int((await tx.execute(_CURSOR_POSITION, {"name": name})).scalar_one())


async def record_cursor_error(tx: Executor, name: str, error: str) -> None:
    await tx.execute(publisher_cursors.update().where(publisher_cursors.c.name == name).values(last_error=error[:2000]))


async def advance_cursor(tx: Executor, name: str, token: str, position: int, now: int) -> None:
    await tx.execute(
        publisher_cursors.update()
        .where(publisher_cursors.c.name == name, leases.held(publisher_cursors, token))
        .values(position=position, updated_at=now, last_error=None)
    )


async def cursor_position(conn: Executor, name: str) -> int | None:
    value = (await conn.execute(_CURSOR_POSITION, {"name": name})).scalar()
    return None if value is None else int(value)


# --- dashboard views over any face's table --------------------------------------------------------------


DURATION_SAMPLE = 100
"""Rows per bucket a dashboard's latency chart averages: the latest finished of each bucket."""


async def mean_duration_by_bucket(
    conn: Executor, start: ColumnElement[int], end: ColumnElement[int], finished: ColumnElement[bool],
    since: int, until: int, bucket_ms: int, *, postgres: bool = False, sample: int = DURATION_SAMPLE,
) -> dict[int, float]:
    """Mean ``end - start`` (ms) of the ``finished`` rows whose ``end`` falls in each ``bucket_ms`` after
    ``since`` (bucket ``(end - since) // bucket_ms``, ``since < end <= until``). Of a sample: the latest
    ``sample`` of each bucket, each a bounded range of an index on (``finished``'s column, ``end``) read
    backwards, so a chart costs the same at 10 or 100,000 rows finished a minute (averaging them all read
    every row of the hour: the overview at ten million rows)."""
    buckets = (until - since) // bucket_ms
    if postgres:  # one statement: a LATERAL range per bucket
        b = func.generate_series(0, buckets).table_valued(column("i", BigInteger)).render_derived(name="b")
        low = since + b.c.i * bucket_ms
        latest = (select((end - start).label("d")).where(finished, end >= low, end < low + bucket_ms, end > since, end <= until)
                  .order_by(end.desc()).limit(sample).lateral("s"))
        query = select(b.c.i, func.avg(latest.c.d)).select_from(b.join(latest, true())).group_by(b.c.i)
        return {int(index): float(mean or 0) for index, mean in (await conn.execute(query)).all()}
    # SQLite has no LATERAL: one statement per bucket costs microseconds there (no network between).
    latest = (select((end - start).label("d")).where(finished, end >= bindparam("b_low"), end < bindparam("b_high"))
              .order_by(end.desc()).limit(sample).subquery())
    statement = select(func.avg(latest.c.d), func.count())
    found: dict[int, float] = {}
    for i in range(buckets + 1):
        bounds = {"b_low": max(since + 1, since + i * bucket_ms), "b_high": min(until + 1, since + (i + 1) * bucket_ms)}
        mean, n = (await conn.execute(statement, bounds)).one()
        if n:
            found[i] = float(mean)
    return found


async def events_per_minute(conn: Executor, since_ms: int) -> dict[tuple[int, str], int]:
    """(minute's start, type) → events written in that minute, for the minutes from ``since_ms`` on (kept
    with the writes, migration core_0008)."""
    counted = await kept_counts.read_counts(conn, event_counts, EVENTS_PER_MINUTE.kind,
                                            from_grp=kept_counts.bucket_key(since_ms))
    return {(int(minute), type_): n for (minute, type_), n in counted.items()}


async def prune_events_per_minute(tx: Executor, before_ms: int) -> int:
    """Retention: forget the counts of the minutes that ended before ``before_ms``."""
    whole = before_ms // MINUTE_MS * MINUTE_MS
    return await kept_counts.prune_groups_before(tx, event_counts, EVENTS_PER_MINUTE.kind, kept_counts.bucket_key(whole))
