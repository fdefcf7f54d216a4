"""A failing disk: the API answers an error, nothing is lost, the server keeps running, and it
recovers by itself when the disk does."""

from __future__ import annotations

import logging

from tests.exchange.conftest import MAILBOX, files_under, listed, open_alerts, process, put, settle, start

PR = "/v1/exchange/processes"


async def test_store_on_a_failing_disk_is_503_stores_nothing_and_works_again_after(client, disk, exchange_dir, store):
    disk.fail()
    response = await client.post(f"{MAILBOX}/messages", content=b"x", headers={"Message-Id": "k1"})
    assert response.status_code == 503 and response.json()["code"] == "storage_unavailable"
    assert (await listed(client))["messages"] == []
    assert files_under(exchange_dir) == set(), "no half-written or temp file is left behind"
    assert (await client.get("/healthz")).status_code == 200
    disk.heal()
    again = await client.post(f"{MAILBOX}/messages", content=b"x", headers={"Message-Id": "k1"})
    assert again.status_code == 201, "the failed attempt did not claim the Message-Id"
    assert [m["id"] for m in (await listed(client))["messages"]] == [again.json()["id"]]


async def test_fsync_failure_on_store_is_an_error_too(client, disk, exchange_dir):
    disk.fail("_fsync")
    response = await client.post(f"{MAILBOX}/messages", content=b"x")
    assert response.status_code == 503
    assert (await listed(client))["messages"] == []


async def test_ready_with_replies_on_a_failing_disk_is_503_and_the_process_stays_started(client, disk, exchange_dir):
    m = await put(client, b"in")
    pid = (await start(client, [m["id"]])).json()["id"]
    disk.fail("_replace")
    reply = {"replies": [{"addressee": "mobile-b", "database": "db-1", "body": "out"}]}
    response = await client.post(f"{PR}/{pid}/ready", json=reply)
    assert response.status_code == 503 and response.json()["code"] == "storage_unavailable"
    assert (await process(client, pid))["state"] == "STARTED"
    disk.heal()
    ok = await client.post(f"{PR}/{pid}/ready", json=reply)
    assert ok.status_code == 200 and ok.json()["process"]["state"] == "READY_TO_COMMIT"
    await client.post(f"{PR}/{pid}/committed")
    assert len((await listed(client, "/v1/exchange/mailboxes/mobile-b/db-1"))["messages"]) == 1


async def test_failing_delete_leaves_cleanup_logged_retried_alerted_and_finishes_when_the_disk_heals(
    app, client, clock, disk, exchange_dir, store, caplog
):
    caplog.set_level(logging.WARNING, logger="mainspring.exchange")
    m = await put(client, b"in")
    pid = (await start(client, [m["id"]])).json()["id"]
    await client.post(f"{PR}/{pid}/ready", json={"replies": [{"addressee": "mobile-b", "database": "db-1", "body": "r"}]})
    disk.fail("_unlink")
    response = await client.post(f"{PR}/{pid}/committed")
    assert response.status_code == 200 and response.json()["state"] == "CLEANUP"
    assert any("failed" in r.getMessage() for r in caplog.records if r.name == "mainspring.exchange")
    assert (await listed(client))["messages"] == [], "messages of a committed process are never listed again"
    assert (await client.get(f"{MAILBOX}/messages/{m['id']}")).status_code == 404
    assert len((await listed(client, "/v1/exchange/mailboxes/mobile-b/db-1"))["messages"]) == 1, "replies are visible"
    assert (await client.post(f"{PR}/{pid}/committed")).json()["state"] == "CLEANUP"
    fresh = await put(client, b"next", mailbox="/v1/exchange/mailboxes/mobile-c/db-1")
    assert fresh["size"] == 4, "the server keeps serving"
    for _ in range(4):
        clock.advance(60_000)
        await settle(app)
    assert (await process(client, pid))["state"] == "CLEANUP"
    assert [a.subject_id for a in await open_alerts(store, "exchange_cleanup_failing")] == [pid]
    disk.heal()
    clock.advance(600_000)
    await settle(app)
    assert (await process(client, pid))["state"] == "DONE"
    assert f"mailboxes/mobile-a/db-1/{m['id']}" not in files_under(exchange_dir)


async def test_failing_quarantine_move_keeps_in_doubt_messages_hidden_until_it_succeeds(app, client, clock, disk, exchange_dir):
    m = await put(client, b"in")
    pid = (await start(client, [m["id"]])).json()["id"]
    await client.post(f"{PR}/{pid}/ready")
    disk.fail("_replace")
    clock.advance(20_000)
    await settle(app)
    assert (await process(client, pid))["state"] == "IN_DOUBT"
    assert (await listed(client))["messages"] == []
    assert (await client.get(f"{MAILBOX}/messages/{m['id']}")).content == b"in", "still readable where it is"
    disk.heal()
    clock.advance(600_000)
    await settle(app)
    assert files_under(exchange_dir) == {f"unknown/{pid}/{m['id']}"}


async def test_failing_move_back_from_unknown_still_gives_the_messages_back(app, client, clock, disk, exchange_dir):
    m = await put(client, b"in")
    pid = (await start(client, [m["id"]])).json()["id"]
    await client.post(f"{PR}/{pid}/ready")
    clock.advance(20_000)
    await settle(app)
    disk.fail("_replace")
    assert (await client.post(f"{PR}/{pid}/commit-failed")).json()["state"] == "ABORTED"
    assert [x["id"] for x in (await listed(client))["messages"]] == [m["id"]]
    assert (await client.get(f"{MAILBOX}/messages/{m['id']}")).content == b"in", "read from unknown/ meanwhile"
    again = await start(client, [m["id"]])
    assert again.status_code == 201
    disk.heal()
    clock.advance(600_000)
    await settle(app)
    assert files_under(exchange_dir) == {f"mailboxes/mobile-a/db-1/{m['id']}"}
