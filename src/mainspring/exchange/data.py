"""Statements of the exchange face, answering typed records: retention of finished processes and the
counts ``/metrics`` shows.

(The protocol's own statements still live beside their services in ``service``, ``messages``, ``sync`` and
``watchdog``; new ones go here.)
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, delete, func, or_, select

from mainspring.exchange.tables import FINISHED_STATES
from mainspring.exchange.tables import exchange_messages as M
from mainspring.exchange.tables import exchange_processes as P
from mainspring.store import Transaction
from mainspring.store.dialect import Executor


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
    addressee: str
    database: str
    count: int


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
    rows = (await conn.execute(select(P.c.state, func.count()).group_by(P.c.state))).all()
    return {str(state): int(n) for state, n in rows}


async def most_waiting_mailboxes(conn: Executor, limit: int) -> tuple[list[MailboxCount], int]:
    """The ``limit`` mailboxes with the most available messages (most first), and the available messages
    of all mailboxes together (one scan: the window sums every group before the limit applies)."""
    waiting = func.count()
    query = (
        select(M.c.addressee, M.c.database, waiting, func.sum(waiting).over())
        .where(M.c.state == "AVAILABLE")
        .group_by(M.c.addressee, M.c.database)
        .order_by(waiting.desc(), M.c.addressee, M.c.database)
        .limit(limit)
    )
    rows = (await conn.execute(query)).all()
    total = int(rows[0][3]) if rows else 0
    return [MailboxCount(str(a), str(d), int(n)) for a, d, n, _ in rows], total
