"""Races: concurrent starts, and a late client racing the watchdog or itself."""

from __future__ import annotations

import asyncio

from tests.exchange.conftest import (
    COMMIT_TIMEOUT_MS,
    MAILBOX,
    files_under,
    listed,
    process,
    put,
    settle,
    start,
)

PR = "/v1/exchange/processes"


async def test_fifty_concurrent_starts_on_one_mailbox_give_exactly_one_201(client):
    ids = [(await put(client, f"m{i}".encode()))["id"] for i in range(3)]
    responses = await asyncio.gather(*[start(client, ids, client_id=f"gedemin-{i}") for i in range(50)])
    created = [r for r in responses if r.status_code == 201]
    assert len(created) == 1
    winner = created[0].json()["id"]
    others = [r for r in responses if r.status_code != 201]
    assert all(r.status_code == 409 for r in others)
    assert all(r.json()["code"] in ("busy", "messages_unavailable") for r in others)
    assert all(r.json()["active_process_id"] == winner for r in others if r.json()["code"] == "busy")
    assert sum(r.json()["code"] == "busy" for r in others) >= 1
    processes = (await client.get(f"{PR}?addressee=mobile-a")).json()["processes"]
    assert [p["id"] for p in processes] == [winner]


async def test_fifty_concurrent_starts_with_disjoint_messages_still_give_one_process(client):
    ids = [(await put(client, f"m{i}".encode()))["id"] for i in range(50)]
    responses = await asyncio.gather(*[start(client, [ids[i]]) for i in range(50)])
    assert sum(r.status_code == 201 for r in responses) == 1
    assert {r.json()["code"] for r in responses if r.status_code != 201} == {"busy"}
    assert len((await listed(client))["messages"]) == 49


async def test_late_committed_racing_the_watchdog_ends_done_either_way(app, client, clock, exchange_dir):
    m = await put(client, b"in")
    pid = (await start(client, [m["id"]])).json()["id"]
    await client.post(f"{PR}/{pid}/ready")
    clock.advance(COMMIT_TIMEOUT_MS)
    committed, _ = await asyncio.gather(client.post(f"{PR}/{pid}/committed"), settle(app))
    assert committed.status_code == 200
    await settle(app)
    assert (await process(client, pid))["state"] == "DONE"
    assert files_under(exchange_dir) == set()
    assert (await listed(client))["messages"] == []


async def test_committed_and_commit_failed_racing_never_both_apply(client):
    m = await put(client, b"in")
    pid = (await start(client, [m["id"]])).json()["id"]
    await client.post(f"{PR}/{pid}/ready")
    ok, failed = await asyncio.gather(client.post(f"{PR}/{pid}/committed"), client.post(f"{PR}/{pid}/commit-failed"))
    state = (await process(client, pid))["state"]
    available = [x["id"] for x in (await listed(client))["messages"]]
    if state == "DONE":
        assert ok.status_code == 200 and failed.status_code == 409 and available == []
    else:
        assert state == "ABORTED" and failed.status_code == 200 and ok.status_code == 409
        assert available == [m["id"]]


async def test_concurrent_stores_with_one_message_id_store_one_message(client, exchange_dir):
    responses = await asyncio.gather(*[
        client.post(f"{MAILBOX}/messages", content=b"same", headers={"Message-Id": "dup"}) for _ in range(20)
    ])
    assert sorted({r.status_code for r in responses}) in ([200, 201], [201])
    assert sum(r.status_code == 201 for r in responses) == 1
    assert len({r.json()["id"] for r in responses}) == 1
    assert len(files_under(exchange_dir)) == 1


async def test_a_conflicting_put_among_concurrent_puts_is_refused_alone(client, exchange_dir):
    assert (await client.post(f"{MAILBOX}/messages", content=b"first", headers={"Message-Id": "taken"})).status_code == 201
    responses = await asyncio.gather(
        *[client.post(f"{MAILBOX}/messages", content=f"m{i}".encode(), headers={"Message-Id": f"k{i}"}) for i in range(10)],
        client.post(f"{MAILBOX}/messages", content=b"other bytes", headers={"Message-Id": "taken"}),
    )
    assert [r.status_code for r in responses] == [201] * 10 + [409]
    listed_ids = {m["id"] for m in (await listed(client))["messages"]}
    assert {r.json()["id"] for r in responses[:10]} <= listed_ids
    assert len(files_under(exchange_dir)) == 11
