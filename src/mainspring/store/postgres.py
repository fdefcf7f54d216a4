"""PostgreSQL: pooled asyncpg connections, SKIP LOCKED, advisory locks, NOTIFY — in as few round trips as
the guarantees allow.

Connections run in autocommit mode and transactions are driven here, so that:
- a read is its statements and nothing else (no BEGIN/ROLLBACK around it: under READ COMMITTED every
  statement has its own snapshot anyway);
- a write is ``BEGIN``, its statements, and one last round trip that sends the wake-ups and ``COMMIT``
  together;
- no connection is pinged before use: one the server closed is noticed locally at checkout, and one lost
  silently fails its first statement, is discarded, and the request is answered 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple

from sqlalchemy import (
    ColumnElement,
    Connection,
    Executable,
    Integer,
    Result,
    Select,
    Table,
    TextClause,
    TextualSelect,
    any_,
    bindparam,
    event,
    func,
    literal,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import Insert as PostgresInsert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.engine import AdaptedConnection
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

from mainspring.store.errors import TransactionAborted, is_unavailable
from mainspring.store.notify import PG_CHANNEL, payloads
from mainspring.store.types import ExecuteParams, Params

if TYPE_CHECKING:
    import asyncpg

    from mainspring.store.dialect import Executor

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

UNIQUE_VIOLATION = "23505"


def lock_key(key: str) -> int:
    """A stable signed 32-bit key for pg_advisory_*; collisions only serialize a little more."""
    value = zlib.crc32(key.encode())
    return value - (1 << 32) if value >= (1 << 31) else value


def quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def notify_and_commit(channels: list[str]) -> str:
    """One simple-protocol query: the wake-ups (delivered only if the commit succeeds; one NOTIFY for all
    of them), then COMMIT."""
    notifies = "".join(f"SELECT pg_notify({quote_literal(PG_CHANNEL)}, {quote_literal(p)});" for p in payloads(channels))
    return notifies + "COMMIT"


_XACT_LOCK = select(func.pg_advisory_xact_lock(bindparam("key", type_=Integer)))
_TRY_XACT_LOCK = select(func.pg_try_advisory_xact_lock(bindparam("key", type_=Integer)))


class RawRow(tuple[Any, ...]):
    """A row of a statement run straight on asyncpg: a tuple whose columns are also attributes (the first of
    a repeated name), as SQLAlchemy's rows are to the code that reads them."""

    __slots__ = ()
    _index: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._index[name]]
        except KeyError:
            raise AttributeError(name) from None


class RawResult:
    """The rows of a statement run straight on asyncpg, read as a SQLAlchemy result is (``all``, ``scalar``)."""

    __slots__ = ("rows",)

    def __init__(self, rows: list[RawRow]) -> None:
        self.rows = rows

    def all(self) -> list[RawRow]:
        return self.rows

    def scalar(self) -> Any:
        return self.rows[0][0] if self.rows else None


class RawStatement:
    """A textual statement compiled once for asyncpg: its SQL with ``$n`` placeholders, the order of its
    parameters, and the row class of its answers (made at its first answer)."""

    __slots__ = ("names", "row", "sql")

    def __init__(self, statement: TextClause | TextualSelect) -> None:
        compiled = statement.compile(dialect=_DIALECT)
        if any(b.expanding or b.literal_execute or b.type._cached_bind_processor(_DIALECT) for b in compiled.binds.values()):
            raise TypeError("only plain textual statements run straight on asyncpg")
        self.sql = compiled.string
        self.names = list(compiled.positiontup or ())
        self.row: type[RawRow] | None = None

    def rows(self, records: list[asyncpg.Record]) -> list[RawRow]:
        if not records:
            return []
        if self.row is None:
            keys = list(records[0].keys())
            self.row = type("Row", (RawRow,), {"__slots__": (), "_index": {k: i for i, k in reversed(list(enumerate(keys)))}})
        row = self.row
        return [row(r) for r in records]


_DIALECT = asyncpg_dialect()
_RAW: dict[TextClause | TextualSelect, RawStatement] = {}


def raw_statement(statement: TextClause | TextualSelect) -> RawStatement:
    """``statement`` compiled for asyncpg, once."""
    raw = _RAW.get(statement)
    if raw is None:
        raw = _RAW[statement] = RawStatement(statement)
    return raw


async def _to_completion(cleanup: Coroutine[Any, Any, None]) -> None:
    """Await ``cleanup`` in a task of its own until it is done; a cancellation that came meanwhile is raised
    after it (as SQLAlchemy's ``AsyncConnection`` closes itself on exit)."""
    task = asyncio.ensure_future(cleanup)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            cancelled = exc
    task.result()
    if cancelled is not None:
        raise cancelled


class PostgresSession:
    """One pooled connection, inside a transaction (writes) or not (reads).

    A write transaction opened ``lazy`` sends its BEGIN with its first statement, unless that statement is
    the whole transaction (``execute_alone``): then it runs in autocommit, one round trip.
    """

    def __init__(self, engine: AsyncEngine, pooled: PoolProxiedConnection, backend: PostgresBackend | None = None,
                 begun: bool = True) -> None:
        self.engine = engine
        self.pooled = pooled
        self.driver: asyncpg.Connection = pooled.driver_connection
        self.backend = backend
        self.begun = begun
        self.done_alone = False
        self.invalidated = False
        self._conn: AsyncConnection | None = None

    @property
    def conn(self) -> AsyncConnection:
        """SQLAlchemy's connection over the pooled one, made at the first Core statement: a transaction of raw
        statements only (the hot paths) never pays for one (measured: a checkout through ``engine.connect()``
        cost ~65 µs of CPU, the pooled connection alone ~18)."""
        if self._conn is None:
            self._conn = AsyncConnection(self.engine, Connection(self.engine.sync_engine, connection=self.pooled))
        return self._conn

    async def invalidate(self) -> None:
        """Close the connection and never give it back to the pool."""
        self.invalidated = True
        if self._conn is not None:
            await self._conn.invalidate()
        else:
            await greenlet_spawn(self.pooled.invalidate)

    async def give_back(self) -> None:
        """Return the connection to the pool (an invalidated one is gone already), to the end even if the
        caller is cancelled meanwhile: a check-in cut halfway would leak the pool's slot."""
        if self._conn is not None:
            await _to_completion(self._conn.close())
        elif not self.invalidated:
            await _to_completion(greenlet_spawn(self.pooled.close))

    async def execute(self, statement: Executable, params: ExecuteParams = None) -> Result[Any]:
        await self._begin_lazily()
        return await self.conn.execute(statement, params)

    async def _begin_lazily(self) -> None:
        if not self.begun:
            self._refuse_after_alone()
            assert self.backend is not None
            self.backend.round_trips += 1
            await self.driver.execute("BEGIN")
            self.begun = True

    async def execute_alone(self, statement: Executable, params: ExecuteParams = None) -> Result[Any]:
        if self.begun:
            raise RuntimeError("execute_alone after another statement of the transaction")
        self._refuse_after_alone()
        self.done_alone = True
        return await self.conn.execute(statement, params)

    async def fetch_prepared(self, sql: str, args: Sequence[object]) -> list[asyncpg.Record]:
        """``sql`` (``$n`` parameters) on the raw asyncpg connection, prepared once per connection (asyncpg's
        statement cache): no SQLAlchemy statement compiled, looked up or wrapped per call."""
        await self._begin_lazily()
        assert self.backend is not None
        self.backend.round_trips += 1
        return await self.driver.fetch(sql, *args)  # type: ignore[no-any-return]

    async def fetch_text(self, statement: TextClause | TextualSelect, params: Params) -> RawResult:
        """A textual statement of a hot path as ``fetch_prepared``, in this transaction (see ``fetch_alone``)."""
        raw = raw_statement(statement)
        return RawResult(raw.rows(await self.fetch_prepared(raw.sql, [params[n] for n in raw.names])))

    async def fetch_alone(self, statement: TextClause | TextualSelect, params: Params) -> RawResult:
        """``execute_alone`` of a textual statement of a hot path as ``fetch_prepared_alone``: the same SQL
        and parameters without SQLAlchemy's execution and result layers (measured: ~40 % of a statement's CPU
        in the worker). Its errors are asyncpg's own (``store.errors`` knows them)."""
        raw = raw_statement(statement)
        return RawResult(raw.rows(await self.fetch_prepared_alone(raw.sql, [params[n] for n in raw.names])))

    async def fetch_prepared_alone(self, sql: str, args: Sequence[object]) -> list[asyncpg.Record]:
        """``fetch_prepared`` as the whole transaction (autocommit, one round trip)."""
        if self.begun:
            raise RuntimeError("execute_alone after another statement of the transaction")
        self._refuse_after_alone()
        self.done_alone = True
        assert self.backend is not None
        self.backend.round_trips += 1
        return await self.driver.fetch(sql, *args)  # type: ignore[no-any-return]

    def _refuse_after_alone(self) -> None:
        if self.done_alone:
            raise RuntimeError("a statement after execute_alone: that transaction has committed")


PREPARED_STATEMENTS = 2000
"""Prepared statements kept per connection: all of Mainspring's, with room for the statements built per call."""


class PostgresBackend:
    name = "postgresql"
    one_statement_writes = events_numbered_last = parallel_reads = counts_per_connection = True
    writes_in_callers_transactions = True

    def __init__(self, url: str, pool_size: int, generic_plans: bool = False) -> None:
        server_settings = {"application_name": "mainspring"}
        if generic_plans:
            server_settings["plan_cache_mode"] = "force_generic_plan"
        self.engine = create_async_engine(
            url,
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_recycle=1800,
            isolation_level="AUTOCOMMIT",
            # A host that swallows packets must not hold a connect for asyncpg's default minute.
            # Every face's background loops together use well over SQLAlchemy's default 100 statements per
            # connection; evicted hot statements were prepared again on every request, each time with asyncpg's
            # type introspection (several ms: a create cost 6.5 ms instead of under 1).
            connect_args={"server_settings": server_settings, "timeout": 10,
                          "prepared_statement_cache_size": PREPARED_STATEMENTS},
        )

        self.round_trips = 0
        """Statements sent to the server (each one round trip; a prepared statement's first use costs one
        more, not counted): what a test counts to keep the hot paths short."""

        @event.listens_for(self.engine.sync_engine, "before_cursor_execute")
        def _count(*_args: object) -> None:
            self.round_trips += 1

        @event.listens_for(self.engine.sync_engine, "checkout")
        def _refuse_closed(dbapi_connection: AdaptedConnection, _record: object, _proxy: object) -> None:
            # A restarted server closes its sockets; asyncpg notices without a round trip.
            if dbapi_connection.driver_connection.is_closed():
                raise DisconnectionError("connection closed by the server")

    # --- what differs in SQL --------------------------------------------------------------------------

    def insert(self, table: Table) -> PostgresInsert:
        return pg_insert(table)

    def skip_locked(self, query: Select[*Ts]) -> Select[*Ts]:
        return query.with_for_update(skip_locked=True)

    def for_update(self, query: Select[*Ts]) -> Select[*Ts]:
        return query.with_for_update()

    def any_of(self, column: ColumnElement[T], values: Iterable[T]) -> ColumnElement[bool]:
        # One array parameter: an IN list of n values is n parameters, each bound and cast per execution.
        return column == any_(literal(list(values), type_=ARRAY(column.type)))

    def for_share(self, query: Select[*Ts]) -> Select[*Ts]:
        return query.with_for_update(read=True)

    async def advisory_xact_lock(self, session: Executor, key: str) -> None:
        await session.execute(_XACT_LOCK, {"key": lock_key(key)})

    async def try_advisory_xact_lock(self, session: Executor, key: str) -> bool:
        return bool((await session.execute(_TRY_XACT_LOCK, {"key": lock_key(key)})).scalar())

    @contextlib.asynccontextmanager
    async def session_lock(self, key: str) -> AsyncIterator[PostgresSession | None]:
        """Try to take the session-level advisory lock ``key`` on a connection of its own, and hold both
        while the block runs: the session to run autocommit statements under the lock, or None (another
        session holds it). A connection lost while holding it loses the lock with it, server-side."""
        async with self._connection() as session:
            self.round_trips += 1
            if not await session.driver.fetchval("SELECT pg_try_advisory_lock($1)", lock_key(key)):
                yield None
                return
            yield session
            # Left by an error, the lock goes with the connection (``_connection`` discards a broken one).
            with contextlib.suppress(Exception):
                await session.driver.execute(f"SELECT pg_advisory_unlock({lock_key(key)})")

    def is_unique_violation(self, exc: BaseException) -> bool:
        orig = getattr(exc, "orig", exc)
        return getattr(orig, "sqlstate", None) == UNIQUE_VIOLATION or getattr(
            getattr(orig, "__cause__", None), "sqlstate", None
        ) == UNIQUE_VIOLATION

    def is_connection_error(self, exc: BaseException) -> bool:
        return bool(getattr(exc, "connection_invalidated", False))

    # --- transactions ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def transaction(self, lazy: bool = False) -> AsyncIterator[PostgresSession]:
        if lazy:
            async with self._connection() as session:
                session.backend, session.begun = self, False
                try:
                    yield session
                except BaseException:
                    await _rollback_or_discard(session)
                    raise
            return
        async with contextlib.AsyncExitStack() as stack:
            session = await stack.enter_async_context(self._connection())
            self.round_trips += 1
            try:
                await session.driver.execute("BEGIN")
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                # A pooled connection that died silently fails here, before anything of this transaction
                # was sent: discard it and begin once more on a fresh one.
                with contextlib.suppress(Exception):
                    await session.invalidate()
                await stack.aclose()
                session = await stack.enter_async_context(self._connection())
                self.round_trips += 1
                await session.driver.execute("BEGIN")
            try:
                yield session
            except BaseException:
                await _rollback_or_discard(session)
                raise

    async def commit(self, session: PostgresSession, channels: list[str]) -> None:
        if not session.begun:
            # Nothing sent yet, or one statement that was the whole transaction (and carried its wake-ups).
            if channels and not session.done_alone:
                self.round_trips += 1
                await session.driver.execute(notify_and_commit(channels).removesuffix("COMMIT"))
            return
        self.round_trips += 1
        try:
            status = await session.driver.execute(notify_and_commit(channels))
        except BaseException:
            await _rollback_or_discard(session)
            raise
        if status != "COMMIT":
            # COMMIT of a transaction a failed statement had aborted answers ROLLBACK, not an error.
            raise TransactionAborted("the transaction was aborted by an earlier error and rolled back")

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[PostgresSession]:
        async with self._connection() as session:
            yield session

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[PostgresSession]:
        session = PostgresSession(self.engine, await self.engine.raw_connection(), self)
        try:
            yield session
        except BaseException as exc:
            if is_unavailable(exc) and not session.invalidated:
                # asyncpg can leave a connection cut mid-operation in a state every later use fails on.
                with contextlib.suppress(Exception):
                    await session.invalidate()
            raise
        finally:
            try:
                if not session.invalidated and (session.driver.is_closed() or session.driver.is_in_transaction()):
                    with contextlib.suppress(Exception):
                        await session.invalidate()
            finally:
                await session.give_back()

    async def run_sync(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` on one connection in one transaction (migrations, DDL)."""
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="READ COMMITTED")
            result = await conn.run_sync(work)
            await conn.commit()
        return result

    async def close(self) -> None:
        await self.engine.dispose()


async def _rollback_or_discard(session: PostgresSession) -> None:
    """Roll back; a connection that cannot even do that is not given back to the pool."""
    try:
        if not session.driver.is_closed() and session.driver.is_in_transaction():
            await session.driver.execute("ROLLBACK")
    except BaseException:
        with contextlib.suppress(Exception):
            await session.invalidate()
