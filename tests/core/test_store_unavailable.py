"""A store that cannot be reached (a database restarting, a cut link) is an expected event: requests answer
``503 unavailable`` with Retry-After and no traceback, a starting server waits for its database, and
everything carries on once it is back. So is a client that hangs up mid-request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asyncpg.exceptions import (
    AdminShutdownError,
    CannotConnectNowError,
    DeadlockDetectedError,
    InterfaceError,
    ReadOnlySQLTransactionError,
    SerializationError,
    UniqueViolationError,
)
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError

from mainspring.store import Store
from mainspring.store.errors import is_unavailable
from tests.chaos.proxy import Proxy
from tests.conftest import ServerProcess


def wrapped(orig: BaseException, kind: type[DBAPIError] = DBAPIError) -> DBAPIError:
    """As SQLAlchemy's asyncpg dialect raises it: the driver's error as ``orig`` and as the cause."""
    error = kind("SELECT 1", {}, orig)
    error.__cause__ = orig
    return error


@pytest.mark.parametrize(
    ("error", "unavailable"),
    [
        (ConnectionRefusedError(111, "refused"), True),
        (TimeoutError(), True),
        (wrapped(CannotConnectNowError("the database system is starting up")), True),
        (wrapped(AdminShutdownError("terminating connection due to administrator command")), True),
        (wrapped(InterfaceError("cannot perform operation: connection is closed")), True),
        (wrapped(Exception("disk I/O error"), OperationalError), True),
        (wrapped(DeadlockDetectedError("deadlock detected")), True),
        (wrapped(SerializationError("could not serialize access")), True),
        # A failover: the connection still reaches the old primary, now a standby (seen in test_failover).
        (wrapped(ReadOnlySQLTransactionError("cannot execute SELECT FOR UPDATE in a read-only transaction")), True),
        (wrapped(UniqueViolationError("duplicate key"), IntegrityError), False),
        (wrapped(Exception("syntax error"), ProgrammingError), False),
        (ValueError("a bug"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_store_errors_are_told_apart_from_bugs(error: BaseException, unavailable: bool) -> None:
    assert is_unavailable(error) is unavailable


async def test_a_request_while_the_store_restarts_is_503_unavailable_without_a_traceback(
    app: Any, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = app.state.context.store

    @contextlib.asynccontextmanager
    async def restarting(*_args: Any, **_kwargs: Any) -> AsyncIterator[Any]:
        raise wrapped(AdminShutdownError("terminating connection due to administrator command"))
        yield  # pragma: no cover

    monkeypatch.setattr(store, "transaction", restarting)
    with caplog.at_level(logging.WARNING):
        answer = await client.post("/v1/queues/q/interactions", json={"message_id": "m1"})
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["code"] == "unavailable"
    assert answer.headers["retry-after"] == "1"
    assert "Traceback" not in answer.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    monkeypatch.undo()
    assert (await client.post("/v1/queues/q/interactions", json={"message_id": "m1"})).status_code == 201


@pytest.mark.slow
async def test_a_server_started_before_its_database_waits_for_it_and_rides_out_a_cut(
    engine: str, database_url: str, tmp_path: Path
) -> None:
    if engine != "postgres":
        pytest.skip("the database is a separate server only on PostgreSQL")
    link = await Proxy(5432).start()
    await link.unlisten()  # the database is "down" when the server starts
    host_port = database_url.split("@", 1)[1].split("/", 1)[0]
    server = ServerProcess(database_url.replace(host_port, f"127.0.0.1:{link.port}"), tmp_path / "data")
    server.start(wait=False)
    try:
        await asyncio.sleep(1.5)
        assert server.proc is not None and server.proc.poll() is None, server.log()
        await link.listen()
        await asyncio.to_thread(server.wait_ready, 60)
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            assert (await client.post("/v1/queues/q/interactions", json={"message_id": "a"})).status_code == 201
            await link.unlisten()  # the database restarts under a running server
            cut = await client.post("/v1/queues/q/interactions", json={"message_id": "b"})
            assert cut.status_code == 503, cut.text
            assert cut.json()["code"] == "unavailable"
            await link.listen()
            for _ in range(50):
                again = await client.post("/v1/queues/q/interactions", json={"message_id": "b"})
                if again.status_code != 503:
                    break
                await asyncio.sleep(0.2)
            assert again.status_code == 201, again.text
        log = server.log()
        assert "Exception in ASGI application" not in log
        assert "Traceback" not in log, log[-3000:]
    finally:
        server.kill()
        await link.close()


async def test_a_connection_asyncpg_lost_track_of_is_discarded_not_pooled(store: Store, engine: str) -> None:
    """Seen in a chaos run during a PostgreSQL restart: a connection cut mid-operation answered every later
    use with InternalClientError, which SQLAlchemy does not count as a disconnect (so it would be pooled)."""
    if engine != "postgres":
        pytest.skip("asyncpg's connections only")
    from asyncpg.exceptions import InternalClientError
    from sqlalchemy import event, text

    invalidated: list[object] = []
    event.listen(store.backend.engine.sync_engine, "invalidate", lambda *_args: invalidated.append(1))
    with pytest.raises(InternalClientError):
        async with store.transaction() as tx:
            await tx.execute(text("SELECT 1"))
            raise InternalClientError("cannot switch to state 12; another operation (2) is in progress")
    assert invalidated, "the broken connection went back to the pool"
    async with store.transaction() as tx:
        assert (await tx.execute(text("SELECT 1"))).scalar() == 1


async def test_a_client_hanging_up_mid_body_is_answered_quietly_and_stores_nothing(
    app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the chaos runs: a producer cut off while uploading a message logged a 500 with a traceback."""
    chunks = [{"type": "http.request", "body": b"half of a mess", "more_body": True}, {"type": "http.disconnect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/exchange/mailboxes/a/b/messages",
             "raw_path": b"/v1/exchange/mailboxes/a/b/messages", "root_path": "", "query_string": b"",
             "headers": [(b"content-type", b"application/octet-stream"), (b"content-length", b"100")],
             "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "app": app}
    with caplog.at_level(logging.INFO):
        await app(scope, receive, send)
    assert sent[0]["status"] == 499
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.get("/v1/exchange/mailboxes/a/b/messages")).json()["messages"] == []


async def test_an_event_stream_rides_out_a_lost_store_and_goes_on(
    live_url: str, store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A failover takes the store away under open SSE streams: each pauses and carries on on the same
    connection once the store is back, rather than ending with a traceback."""
    from mainspring.core import outbox

    async with store.transaction() as tx:
        await outbox.emit(tx, "test.n", "test", "s", {"n": 0})
    await outbox.wait_numbered(store)
    real_read = store.read
    received: list[int] = []
    first = asyncio.Event()

    @contextlib.asynccontextmanager
    async def lost(*_args: Any, **_kwargs: Any) -> AsyncIterator[Any]:
        raise wrapped(AdminShutdownError("terminating connection due to administrator command"))
        yield  # pragma: no cover

    async def read_stream() -> None:
        async with httpx.AsyncClient(base_url=live_url, timeout=30) as client, client.stream("GET", "/v1/events/stream") as response:
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    received.append(json.loads(line[5:])["data"]["n"])
                    first.set()
                    if len(received) == 2:
                        return

    with caplog.at_level(logging.WARNING):
        reader = asyncio.create_task(read_stream())
        await asyncio.wait_for(first.wait(), 10)
        monkeypatch.setattr(store, "read", lost)
        async with store.transaction() as tx:
            await outbox.emit(tx, "test.n", "test", "s", {"n": 1})
        store.notifier.signal_all()
        await asyncio.sleep(1.5)  # the stream meets the lost store at least once
        monkeypatch.setattr(store, "read", real_read)
        await outbox.wait_numbered(store)
        await asyncio.wait_for(reader, 15)
    assert received == [0, 1]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_a_commit_cut_off_in_the_driver_itself_is_503_without_a_traceback(
    app: Any, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store drives BEGIN and NOTIFY + COMMIT on asyncpg directly: a primary killed during the COMMIT
    raises asyncpg's own error, not SQLAlchemy's, and that too is a 503 handled where the store's errors are
    (Starlette re-raises what reaches the catch-all handler, and uvicorn logs it as a crash)."""
    from asyncpg.exceptions import ConnectionDoesNotExistError

    store = app.state.context.store

    @contextlib.asynccontextmanager
    async def cut_off(*_args: Any, **_kwargs: Any) -> AsyncIterator[Any]:
        raise ConnectionDoesNotExistError("connection was closed in the middle of operation")
        yield  # pragma: no cover

    monkeypatch.setattr(store, "transaction", cut_off)
    with caplog.at_level(logging.WARNING):
        answer = await client.post("/v1/interactions/1/release", json={"token": "t", "outcome": {"complete": {}}})
    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "unavailable"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
