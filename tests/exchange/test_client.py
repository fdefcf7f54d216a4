"""The client protocol helper with SQLite and PostgreSQL as the ERP database: exactly-once effects,
replies, retries, and resolving its own undecided processes — including after being killed at each step."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path
from unittest.mock import ANY

import httpx
import pytest

from mainspring.client.exchange import (
    AsyncExchangeClient,
    ExchangeClient,
    ExchangeProcessor,
    database_ids,
    own_database_id,
)
from tests.exchange.conftest import COMMIT_TIMEOUT_MS, settle
from tests.exchange.erp import apply_effects, create_schema, effect_counts, erp_engine, processor

ERP_BOX = "/v1/exchange/mailboxes/mobile-a/erp-1"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def erp_url(engine: str, database_url: str, tmp_path: Path) -> str:
    # PostgreSQL: the ERP tables live beside Mainspring's in the test database; SQLite: a file of its own.
    return f"sqlite:///{tmp_path / 'erp.db'}" if engine == "sqlite" else database_url


@pytest.fixture
async def erp(erp_url: str):
    engine = erp_engine(erp_url)
    await create_schema(engine)
    yield engine
    await engine.dispose()


class Flaky(httpx.AsyncBaseTransport):
    """Drops chosen requests: before they reach the server (``fail_before``) or after (``lose_answer``)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.fail_before: dict[str, int] = {}
        self.lose_answer: dict[str, int] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        step = request.url.path.rsplit("/", 1)[-1]
        if self.fail_before.get(step, 0) > 0:
            self.fail_before[step] -= 1
            raise httpx.ConnectError("connection refused", request=request)
        response = await self.inner.handle_async_request(request)
        if self.lose_answer.get(step, 0) > 0:
            self.lose_answer[step] -= 1
            raise httpx.ReadError("connection reset", request=request)
        return response


@pytest.fixture
def flaky(app) -> Flaky:
    return Flaky(httpx.ASGITransport(app=app))


@pytest.fixture
async def exchange(flaky: Flaky):
    client = AsyncExchangeClient("http://mainspring.test", transport=flaky, attempts=4, max_wait=0.01)
    yield client
    await client.aclose()


async def fill(client, n: int) -> list[str]:
    ids = []
    for i in range(n):
        response = await client.post(f"{ERP_BOX}/messages", content=f"order {i}".encode())
        ids.append(response.json()["id"])
    return ids


async def drain(worker: ExchangeProcessor, rounds: int = 20) -> None:
    await worker.ensure_marker_table()
    for _ in range(rounds):
        outcome = await worker.process_once()
        if outcome.status == "empty":
            return
    raise AssertionError("the mailbox never drained")


async def test_client_processes_every_message_once_and_publishes_replies(client, exchange, erp):
    ids = await fill(client, 7)
    await drain(processor(exchange, erp))
    assert await effect_counts(erp) == {i: 1 for i in ids}
    receipts = (await client.get("/v1/exchange/mailboxes/mobile-a/receipts/messages")).json()["messages"]
    assert len(receipts) == 7
    states = {p["state"] for p in (await client.get("/v1/exchange/processes?addressee=mobile-a")).json()["processes"]}
    assert states == {"DONE"}


async def test_client_declines_a_batch_it_cannot_take_whole(client, exchange, erp):
    await fill(client, 2)
    worker = ExchangeProcessor(exchange, erp, addressee="mobile-a", database="erp-1", client_id="g",
                               handler=apply_effects, accept=lambda messages: len(messages) > 5)
    await worker.ensure_marker_table()
    assert (await worker.process_once()).status == "declined"
    assert (await client.get("/v1/exchange/processes?addressee=mobile-a")).json()["processes"] == []


async def test_client_reports_busy_and_leaves_the_other_process_alone(client, exchange, erp):
    ids = await fill(client, 1)
    other = await client.post(f"{ERP_BOX}/processes", json={"client_id": "gedemin-b", "message_ids": ids})
    worker = processor(exchange, erp)
    await worker.ensure_marker_table()
    outcome = await worker.process_once()
    assert outcome.status == "busy" and outcome.process_id == other.json()["id"]
    assert (await client.get(f"/v1/exchange/processes/{other.json()['id']}")).json()["state"] == "STARTED"


async def test_handler_failure_rolls_back_and_gives_the_messages_back(client, exchange, erp):
    ids = await fill(client, 2)

    async def broken(conn, messages):
        await apply_effects(conn, messages)
        raise RuntimeError("business rule violated")

    worker = ExchangeProcessor(exchange, erp, addressee="mobile-a", database="erp-1", client_id="g", handler=broken)
    await worker.ensure_marker_table()
    with pytest.raises(RuntimeError):
        await worker.process_once()
    assert await effect_counts(erp) == {}
    assert [m["id"] for m in (await client.get(f"{ERP_BOX}/messages")).json()["messages"]] == ids
    await drain(processor(exchange, erp))
    assert await effect_counts(erp) == {i: 1 for i in ids}


async def test_network_errors_are_retried_with_backoff(client, exchange, flaky, erp):
    ids = await fill(client, 3)
    flaky.fail_before.update({"messages": 2, "ready": 2, "committed": 3})
    await drain(processor(exchange, erp))
    assert await effect_counts(erp) == {i: 1 for i in ids}


async def test_a_lost_ready_answer_rolls_back_and_the_next_round_processes_once(client, exchange, flaky, erp):
    ids = await fill(client, 2)
    flaky.lose_answer["ready"] = 4  # every retry of API_3 loses its answer: the client must roll back
    await drain(processor(exchange, erp))
    assert await effect_counts(erp) == {i: 1 for i in ids}


async def test_a_lost_committed_is_delivered_by_the_next_round(client, exchange, flaky, erp):
    ids = await fill(client, 2)
    flaky.fail_before["committed"] = 4  # every retry of one round
    worker = processor(exchange, erp)
    await worker.ensure_marker_table()
    first = await worker.process_once()
    assert first.status == "committed"
    assert (await client.get(f"/v1/exchange/processes/{first.process_id}")).json()["state"] == "READY_TO_COMMIT"
    await drain(worker)
    assert (await client.get(f"/v1/exchange/processes/{first.process_id}")).json()["state"] == "DONE"
    assert await effect_counts(erp) == {i: 1 for i in ids}


async def test_client_resolves_in_doubt_processes_from_its_marker_table(app, client, clock, exchange, flaky, erp):
    ids = await fill(client, 2)
    flaky.fail_before["committed"] = 4  # every retry of one round
    worker = processor(exchange, erp)
    await worker.ensure_marker_table()
    committed = await worker.process_once()
    clock.advance(COMMIT_TIMEOUT_MS)
    await settle(app)
    assert (await client.get(f"/v1/exchange/processes/{committed.process_id}")).json()["state"] == "IN_DOUBT"
    # Another instance on the same ERP database resolves it: the marker row says committed.
    await drain(processor(exchange, erp, client_id="gedemin-b"))
    assert (await client.get(f"/v1/exchange/processes/{committed.process_id}")).json()["state"] == "DONE"
    assert await effect_counts(erp) == {i: 1 for i in ids}


async def test_an_in_doubt_process_without_a_marker_is_aborted_and_fenced(app, client, clock, exchange, erp):
    ids = await fill(client, 2)
    pid = (await client.post(f"{ERP_BOX}/processes", json={"client_id": "gone", "message_ids": ids})).json()["id"]
    await client.post(f"/v1/exchange/processes/{pid}/ready")
    clock.advance(COMMIT_TIMEOUT_MS)
    await settle(app)
    worker = processor(exchange, erp)
    await drain(worker)
    assert (await client.get(f"/v1/exchange/processes/{pid}")).json()["state"] == "ABORTED"
    assert await worker.was_committed(pid) is False, "the fence stays: that transaction can never commit now"
    assert await effect_counts(erp) == {i: 1 for i in ids}


def test_sync_client_stores_reads_and_runs_the_protocol(servers):
    (server,) = servers(1)
    with ExchangeClient(server.url) as sync:
        stored = sync.store("mobile-a", "erp-1", b"hello", message_id="k-1", content_type="text/plain")
        assert sync.store("mobile-a", "erp-1", b"hello", message_id="k-1")["id"] == stored["id"]
        assert sync.read("mobile-a", "erp-1", stored["id"]) == b"hello"
        process = sync.start("mobile-a", "erp-1", "g", [stored["id"]])
        assert sync.ready(process["id"])["status"] == "OK"
        assert sync.committed(process["id"])["state"] == "DONE"


@pytest.mark.slow
@pytest.mark.parametrize("crash_at", ["started", "before_ready", "after_ready", "after_db_commit", "before_committed"])
async def test_client_killed_at_each_step_still_gives_every_effect_exactly_once(servers, erp_url, erp, crash_at):
    (server,) = servers(1, env={"MAINSPRING_EXCHANGE__PROCESS_TIMEOUT_MS": "600000",
                                "MAINSPRING_EXCHANGE__COMMIT_TIMEOUT_MS": "600000"})
    with ExchangeClient(server.url) as sync:
        ids = [sync.store("mobile-a", "erp-1", f"order {i}".encode())["id"] for i in range(5)]
    run = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "tests.exchange.erp", server.url, erp_url, crash_at],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == -9, run.stdout + run.stderr
    assert "crashing_at" in run.stdout
    # A fresh run of the program, with no operator and no timeout to wait for, finishes the job.
    async with AsyncExchangeClient(server.url) as client:
        await drain(processor(client, erp))
        pending = [p for s in ("STARTED", "READY_TO_COMMIT", "IN_DOUBT") for p in await client.processes("mobile-a", "erp-1", s)]
    assert pending == []
    assert await effect_counts(erp) == {i: 1 for i in ids}


async def test_without_a_database_id_the_erp_database_makes_its_own_and_keeps_it(client, exchange, erp):
    """Seed 000: each ERP database has its own id, kept in the database itself (a restored backup keeps it)."""
    first = ExchangeProcessor(exchange, erp, addressee="mobile-a", client_id="gedemin-a", handler=apply_effects)
    second = ExchangeProcessor(exchange, erp, addressee="mobile-a", client_id="gedemin-b", handler=apply_effects)
    await asyncio.gather(first.ensure_marker_table(), second.ensure_marker_table())
    database = await first.database_id()
    assert str(uuid.UUID(database)) == database
    assert await second.database_id() == database == await own_database_id(erp)
    async with erp.connect() as conn:
        assert (await conn.execute(database_ids.select())).all() == [(1, database, ANY)]

    box = f"/v1/exchange/mailboxes/mobile-a/{database}"
    ids = [(await client.post(f"{box}/messages", content=f"order {i}".encode())).json()["id"] for i in range(3)]
    await drain(second)
    assert await effect_counts(erp) == {i: 1 for i in ids}
    processes = (await client.get(f"/v1/exchange/processes?database={database}")).json()["processes"]
    assert {p["state"] for p in processes} == {"DONE"}


async def test_a_database_id_given_explicitly_is_used_and_none_is_made(exchange, erp):
    worker = ExchangeProcessor(exchange, erp, addressee="mobile-a", database="erp-1", client_id="g",
                               handler=apply_effects)
    await worker.ensure_marker_table()
    assert await worker.database_id() == "erp-1"
    async with erp.connect() as conn:
        assert (await conn.execute(database_ids.select())).all() == []
