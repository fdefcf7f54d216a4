"""The exchange's hot writes stay short: a put's statements (round trips on PostgreSQL) are counted, and its
event is the same whichever path wrote it."""

from __future__ import annotations

import asyncio
import hashlib

import httpx

from mainspring.core import outbox
from mainspring.core.data import events_after
from mainspring.store import Store
from tests.core import test_round_trips
from tests.exchange.conftest import MAILBOX

PUTS = 10
quiet_client = test_round_trips.quiet_client
"""The API without its background loops, whose statements would be counted too."""


async def test_a_put_alone_in_its_commit_is_one_round_trip_on_postgresql(store: Store, quiet_client: httpx.AsyncClient) -> None:
    assert (await quiet_client.post(f"{MAILBOX}/messages", content=b"warm")).status_code == 201
    before = store.backend.round_trips
    for i in range(PUTS):
        assert (await quiet_client.post(f"{MAILBOX}/messages", content=b"body %d" % i)).status_code == 201
    per_put = (store.backend.round_trips - before) / PUTS
    # PostgreSQL: one autocommit statement storing the row, its event and the wake-ups. SQLite: BEGIN
    # IMMEDIATE, the row, its event, COMMIT.
    assert per_put <= (1 if store.is_postgres else 4), per_put


async def test_puts_arriving_together_share_one_statement_and_each_has_its_event(store: Store, quiet_client: httpx.AsyncClient) -> None:
    assert (await quiet_client.post(f"{MAILBOX}/messages", content=b"warm")).status_code == 201
    bodies = [b"together %d" % i for i in range(PUTS)]
    answers = await asyncio.gather(*[quiet_client.post(f"{MAILBOX}/messages", content=body) for body in bodies])
    assert all(a.status_code == 201 for a in answers)
    await outbox.wait_numbered(store)
    async with store.read() as conn:
        events, _ = await events_after(conn, 0, 1000)
    stored = {e.subject_id: e for e in events if e.type == "exchange.message.stored"}
    for body, answer in zip(bodies, answers, strict=True):
        event = stored[answer.json()["id"]]
        assert event.subject_kind == "exchange.message"
        assert event.data == {"addressee": "mobile-a", "database": "db-1", "size": len(body),
                              "sha256": hashlib.sha256(body).hexdigest()}


async def test_a_put_whose_message_id_races_another_answers_the_winner(store: Store, quiet_client: httpx.AsyncClient) -> None:
    # Two puts of one Message-Id in the same group: the shared statement fails on the unique key, the group is
    # run again one put at a time, and both answer the one message.
    answers = await asyncio.gather(*[
        quiet_client.post(f"{MAILBOX}/messages", content=b"same", headers={"Message-Id": "k-1"}) for _ in range(4)
    ])
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 201]
    assert len({a.json()["id"] for a in answers}) == 1


async def _cycle(client: httpx.AsyncClient, store: Store, n: int) -> tuple[int, int]:
    """One full cycle of ``n`` messages; answers the round trips of the whole cycle and of its API_4."""
    before = store.backend.round_trips
    ids = []
    for i in range(n):
        answer = await client.post(f"{MAILBOX}/messages", content=b"cycle %d" % i)
        assert answer.status_code == 201
        ids.append(answer.json()["id"])
    started = await client.post(f"{MAILBOX}/processes", json={"client_id": "g", "message_ids": ids})
    assert started.status_code == 201, started.text
    pid = started.json()["id"]
    assert (await client.post(f"/v1/exchange/processes/{pid}/ready")).status_code == 200
    at_commit = store.backend.round_trips
    done = await client.post(f"/v1/exchange/processes/{pid}/committed")
    assert done.status_code == 200 and done.json()["state"] == "DONE", done.text
    return store.backend.round_trips - before, store.backend.round_trips - at_commit


async def test_a_full_cycles_commit_deletes_its_files_in_few_round_trips_on_postgresql(
    store: Store, quiet_client: httpx.AsyncClient
) -> None:
    # API_4: lock, commit the messages (their file moves come back from that UPDATE), publish the replies,
    # the process to CLEANUP and its event, commit; after the deletes: mark the files done, CLEANUP -> DONE
    # (answered from that UPDATE), its event, commit. Nothing is read again.
    await _cycle(quiet_client, store, PUTS)  # warm: prepared statements
    whole, commit = await _cycle(quiet_client, store, PUTS)
    print(f"round trips ({store.dialect.name}): cycle {whole}, API_4 {commit}")
    if store.is_postgres:
        assert commit <= 12, commit
