"""Clients of the exchange, and the protocol helper that runs API_1…API_5 for an application.

``ExchangeClient`` / ``AsyncExchangeClient``: one method per call of API.md §1; the calls that are safe to
repeat are retried under the clients' one retry policy (``mainspring.client.policy``).

``ExchangeProcessor``: fetch → start → your handler inside *your* database transaction → ready (with replies)
→ commit → committed / commit-failed. In the same transaction it writes the process id into a marker table
of your database, so after any crash (of this program, the server or the network) it tells the server the
truth about an undecided process by itself: committed if and only if the marker row exists. Deciding is
fenced: it inserts an "aborted" marker, which either fails because the original transaction committed its
"committed" marker, or makes sure that transaction can never commit.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from mainspring.client._async.exchange import AsyncExchangeClient
from mainspring.client._sync.exchange import ExchangeClient
from mainspring.client.errors import (
    ApiError,
    Busy,
    Cancelled,
    MessagesUnavailable,
    NotFound,
    ServiceUnavailable,
)
from mainspring.client.models import Message, Process, Reply

log = logging.getLogger("mainspring.client.exchange")

ExchangeError = ApiError
"""The name this error had before every client shared ``mainspring.client.errors``."""
Unavailable = ServiceUnavailable
"""The name this error had before every client shared ``mainspring.client.errors``."""

__all__ = [
    "AsyncExchangeClient", "Busy", "Cancelled", "ExchangeClient", "ExchangeError", "ExchangeProcessor",
    "InboundMessage", "MessagesUnavailable", "NotFound", "Outcome", "Reply", "ServiceUnavailable", "Unavailable",
    "own_database_id",
]


# --- the protocol helper ---------------------------------------------------------------------------------

marker_metadata = MetaData()
markers = Table(
    "mainspring_exchange_markers",
    marker_metadata,
    Column("process_id", String(64), primary_key=True),
    Column("outcome", String(16), nullable=False),  # "committed" (by the handler's transaction) or "aborted" (a fence)
    Column("addressee", String(128), nullable=False),
    Column("database_id", String(128), nullable=False),
    Column("at_ms", BigInteger, nullable=False),
)
# Seed 000: every ERP database has its own id, kept in the database itself — so it travels with a backup and
# survives a restore, which the ERP's own DBID does not. One row, made on first use.
database_ids = Table(
    "mainspring_exchange_database",
    marker_metadata,
    Column("singleton", Integer, primary_key=True, autoincrement=False),  # always 1: one id per database
    Column("database_id", String(64), nullable=False),
    Column("created_at_ms", BigInteger, nullable=False),
)


async def own_database_id(engine: AsyncEngine) -> str:
    """The id the ERP database behind ``engine`` keeps for itself (a UUID), made on first use.

    The marker tables must exist (``ExchangeProcessor.ensure_marker_table``). Clients sharing one database
    that ask at the same moment all get the same id: the first insert wins, the others read it.
    """
    async with engine.connect() as conn:
        found = (await conn.execute(select(database_ids.c.database_id))).scalar()
    if found is not None:
        return str(found)
    try:
        async with engine.begin() as conn:
            await conn.execute(database_ids.insert().values(
                singleton=1, database_id=str(uuid.uuid4()), created_at_ms=int(time.time() * 1000)))
    except IntegrityError:
        pass  # another client of this database made it first: that one is the id
    async with engine.connect() as conn:
        return str((await conn.execute(select(database_ids.c.database_id))).scalar_one())


@dataclass
class InboundMessage:
    id: str
    content_type: str
    sender: str | None
    created_at: str
    size: int
    body: bytes
    meta: Mapping[str, object] = field(default_factory=dict)
    """The message as listed (``models.Message``)."""


@dataclass
class Outcome:
    """What one round of the protocol did."""

    status: str  # "committed", "aborted", "cancelled", "busy", "empty", "declined", "unavailable"
    process_id: str | None = None
    message_ids: list[str] = field(default_factory=list)


Handler = Callable[[AsyncConnection, list[InboundMessage]], Awaitable[list[Reply] | None]]


class ExchangeProcessor:
    """Runs the exchange protocol for one mailbox against your SQLAlchemy ``AsyncEngine`` (SQLite via
    aiosqlite, PostgreSQL via asyncpg, …).

    ``handler(conn, messages)`` runs inside the transaction that also writes the marker; it changes your
    database through ``conn`` only, and answers the replies to publish (or None). It must not commit.
    ``accept(messages)`` may decline a batch (the seed's step 2: all or none).
    ``database`` is the mailbox's database id; without one, the id the ERP database keeps for itself
    (``own_database_id``, made on first use) is used, so every client of one database uses the same mailbox.
    """

    def __init__(
        self,
        client: AsyncExchangeClient,
        engine: AsyncEngine,
        *,
        addressee: str,
        database: str | None = None,
        client_id: str,
        handler: Handler,
        accept: Callable[[list[Message]], bool] | None = None,
        batch_limit: int = 100,
        heartbeat_s: float | None = None,
    ) -> None:
        self.client = client
        self.engine = engine
        self.addressee = addressee
        self.database = database
        self.client_id = client_id
        self.handler = handler
        self.accept = accept
        self.batch_limit = batch_limit
        self.heartbeat_s = heartbeat_s
        self.crash_hook: Callable[[str], None] = lambda _step: None
        """Called at each step ("started", "before_ready", "after_ready", "after_db_commit",
        "before_committed"); tests use it to kill the program there."""

    async def ensure_marker_table(self) -> None:
        """Create the marker tables if missing and learn the mailbox's database id (see ``database``)."""
        try:
            await self._create_marker_tables()
        except DBAPIError:
            # Another client of this database created them at the same moment (CREATE TABLE lost the race,
            # once the winner committed): they exist now, and looking first sees them.
            await self._create_marker_tables()
        if self.database is None:
            self.database = await own_database_id(self.engine)

    async def _create_marker_tables(self) -> None:
        async with self.engine.begin() as conn:
            await conn.run_sync(marker_metadata.create_all)

    async def database_id(self) -> str:
        """The mailbox's database id: the one given, else the ERP database's own."""
        if self.database is None:
            await self.ensure_marker_table()
        assert self.database is not None  # ensure_marker_table learnt it
        return self.database

    async def was_committed(self, process_id: str) -> bool | None:
        """Fence ``process_id`` and answer whether its transaction committed (None: cannot tell yet)."""
        row = {"process_id": process_id, "outcome": "aborted", "addressee": self.addressee,
               "database_id": await self.database_id(), "at_ms": int(time.time() * 1000)}
        try:
            async with self.engine.begin() as conn:
                await conn.execute(markers.insert().values(**row))
            return False
        except IntegrityError:
            pass
        except DBAPIError as exc:
            log.warning("cannot fence process %s yet: %s", process_id, exc)
            return None
        async with self.engine.connect() as conn:
            outcome = (await conn.execute(select(markers.c.outcome).where(markers.c.process_id == process_id))).scalar()
        return outcome == "committed"

    async def _tell(self, process_id: str, committed: bool, reason: str) -> None:
        try:
            if committed:
                await self.client.committed(process_id)
            else:
                await self.client.commit_failed(process_id, reason)
        except Cancelled as exc:
            log.error("the server refused the outcome of process %s: %s", process_id, exc)
        except ExchangeError as exc:
            if exc.code != "already_committed":
                raise
            log.error("process %s: %s", process_id, exc)

    async def settle(self, process_id: str, reason: str) -> bool | None:
        """Tell the server the truth about ``process_id`` from the marker table."""
        committed = await self.was_committed(process_id)
        if committed is None:
            return None
        await self._tell(process_id, committed, reason)
        return committed

    async def resolve_pending(self) -> int:
        """Settle every undecided process this database can answer for: IN_DOUBT ones of the mailbox, and
        READY_TO_COMMIT or STARTED ones of this client id (a previous run of this program)."""
        settled = 0
        database = await self.database_id()
        for state in ("IN_DOUBT", "READY_TO_COMMIT", "STARTED"):
            for process in await self.client.processes(self.addressee, database, state):
                if state != "IN_DOUBT" and process["client_id"] != self.client_id:
                    continue
                if await self.settle(process["id"], f"resolved by {self.client_id} from its marker table") is not None:
                    settled += 1
        return settled

    async def _start(self, message_ids: list[str]) -> Process | None:
        try:
            return await self.client.start(self.addressee, await self.database_id(), self.client_id, message_ids)
        except ServiceUnavailable:
            # The answer may be lost after the server started it: the next resolve_pending finds it by
            # our client id and settles it (no marker: aborted).
            log.warning("no answer to API_2; any process it made is settled on the next round")
            return None

    async def process_once(self) -> Outcome:
        """One round: resolve leftovers, then fetch, start, handle, ready, commit, committed."""
        await self.resolve_pending()
        database = await self.database_id()
        page = await self.client.list(self.addressee, database, self.batch_limit)
        if page["busy"]:
            return Outcome("busy", page["active_process_id"])
        listed = page["messages"]
        if not listed:
            return Outcome("empty")
        if self.accept is not None and not self.accept(listed):
            return Outcome("declined", message_ids=[m["id"] for m in listed])
        ids = [m["id"] for m in listed]
        try:
            process = await self._start(ids)
        except Busy as exc:
            return Outcome("busy", exc.active_process_id)
        except MessagesUnavailable:
            return Outcome("unavailable", message_ids=ids)
        if process is None:
            return Outcome("unavailable", message_ids=ids)
        pid = process["id"]
        self.crash_hook("started")
        # The process is alive from here: reading many large bodies may outlast the process timeout.
        beating = asyncio.create_task(self._heartbeats(pid)) if self.heartbeat_s else None
        try:
            messages = [
                InboundMessage(m["id"], m["content_type"], m["sender"], m["created_at"], m["size"],
                               await self.client.read(self.addressee, database, m["id"]), m)
                for m in listed
            ]
        except BaseException:
            if beating:
                beating.cancel()
            raise
        return await self._run_transaction(pid, messages, beating)

    async def _heartbeats(self, pid: str) -> None:
        assert self.heartbeat_s is not None
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.client.heartbeat(pid)
            except ExchangeError as exc:
                log.warning("heartbeat of %s failed: %s", pid, exc)

    async def _run_transaction(
        self, pid: str, messages: list[InboundMessage], beating: asyncio.Task[None] | None
    ) -> Outcome:
        ids = [m.id for m in messages]
        conn = await self.engine.connect()
        committed = False
        try:
            tx = await conn.begin()
            try:
                # First, so that a fence by another run is met before any work is done.
                await conn.execute(markers.insert().values(
                    process_id=pid, outcome="committed", addressee=self.addressee, database_id=await self.database_id(),
                    at_ms=int(time.time() * 1000)))
                replies = await self.handler(conn, messages) or []
                self.crash_hook("before_ready")
                await self.client.ready(pid, replies)
                self.crash_hook("after_ready")
            except BaseException as exc:
                await tx.rollback()
                if beating:
                    beating.cancel()
                if isinstance(exc, Cancelled):
                    return Outcome("cancelled", pid, ids)
                await self._abandon(pid, f"rolled back: {type(exc).__name__}: {exc}")
                if isinstance(exc, IntegrityError | ServiceUnavailable):
                    return Outcome("aborted", pid, ids)
                raise
            try:
                await tx.commit()
                committed = True
            except Exception as exc:
                log.warning("commit of process %s failed (%s); asking the marker table", pid, exc)
        finally:
            if beating:
                beating.cancel()
            await conn.close()
        self.crash_hook("after_db_commit")
        if not committed:
            outcome = await self.settle(pid, "the database commit failed")
            return Outcome("committed" if outcome else "aborted", pid, ids)
        self.crash_hook("before_committed")
        try:
            await self.client.committed(pid)
        except ServiceUnavailable as exc:
            log.warning("API_4 of %s not delivered (%s); resolve_pending delivers it", pid, exc)
        return Outcome("committed", pid, ids)

    async def _abandon(self, pid: str, reason: str) -> None:
        # Our transaction is rolled back, so API_5 is the truth; if it cannot be told now, the fence in
        # resolve_pending tells it later.
        try:
            await self.client.commit_failed(pid, reason)
        except ExchangeError as exc:
            log.warning("API_5 of %s not delivered (%s); resolve_pending delivers it", pid, exc)

    async def run(self, stop: asyncio.Event | None = None, *, idle_s: float = 1.0, max_idle_s: float = 30.0) -> None:
        """Process until ``stop`` is set. Busy, empty and failing rounds back off with jitter."""
        stop = stop or asyncio.Event()
        await self.ensure_marker_table()
        failures = 0
        while not stop.is_set():
            try:
                outcome = await self.process_once()
                failures = 0 if outcome.status == "committed" else failures + 1
            except (ServiceUnavailable, DBAPIError) as exc:
                log.warning("exchange round failed: %s", exc)
                failures += 1
            if failures:
                delay = min(max_idle_s, idle_s * 2 ** min(failures - 1, 10)) * random.uniform(0.5, 1.0)
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass
