"""The seed's processing steps 1–13, one named test (or a few) per step, on both engines."""

from __future__ import annotations

from tests.exchange.conftest import (
    COMMIT_TIMEOUT_MS,
    MAILBOX,
    PROCESS_TIMEOUT_MS,
    event_types,
    files_under,
    listed,
    open_alerts,
    process,
    put,
    settle,
    start,
)

P = "/v1/exchange/processes"


async def started(client, n=2, mailbox=MAILBOX):
    ids = [(await put(client, f"msg-{i}".encode(), mailbox=mailbox))["id"] for i in range(n)]
    response = await start(client, ids, mailbox=mailbox)
    assert response.status_code == 201, response.text
    return ids, response.json()


async def test_step1_api1_lists_only_available_messages_with_busy_and_active_process(client):
    _ids, proc = await started(client, 2)
    late = await put(client, b"arrived later")
    page = await listed(client)
    assert [m["id"] for m in page["messages"]] == [late["id"]], "taken messages are not available"
    assert page["busy"] is True and page["active_process_id"] == proc["id"]


async def test_step2_start_is_all_or_nothing_with_the_offending_ids(client):
    good = await put(client, b"good")
    other_box = await put(client, b"other", mailbox="/v1/exchange/mailboxes/mobile-b/db-1")
    response = await start(client, [good["id"], other_box["id"], "m-unknown"])
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "messages_unavailable"
    assert body["message_ids"] == [other_box["id"], "m-unknown"]
    page = await listed(client)
    assert [m["id"] for m in page["messages"]] == [good["id"]] and page["busy"] is False
    assert (await client.get(f"{P}?addressee=mobile-a")).json()["processes"] == []


async def test_step2_taken_messages_are_unavailable_to_a_second_start(client):
    ids, proc = await started(client, 1)
    await client.post(f"{P}/{proc['id']}/commit-failed")
    again = await start(client, ids)
    assert again.status_code == 201
    await client.post(f"{P}/{again.json()['id']}/ready")
    await client.post(f"{P}/{again.json()['id']}/committed")
    third = await start(client, ids)
    assert third.status_code == 409 and third.json()["code"] == "messages_unavailable"


async def test_step2_empty_message_list_is_422(client):
    response = await client.post(f"{MAILBOX}/processes", json={"client_id": "g", "message_ids": []})
    assert response.status_code == 422 and response.json()["code"] == "invalid_request"
    bad = await client.post(f"{MAILBOX}/processes", json={"client_id": "g g", "message_ids": ["x"]})
    assert bad.status_code == 422


async def test_step3_and_5_start_creates_a_started_process_object(client, clock, store):
    ids, proc = await started(client, 2)
    assert proc["state"] == "STARTED"
    assert proc["addressee"] == "mobile-a" and proc["database"] == "db-1" and proc["client_id"] == "gedemin-a"
    assert proc["message_ids"] == ids
    assert proc["started_at"] and proc["deadline"] and proc["updated_at"]
    assert await process(client, proc["id"]) == proc
    assert await event_types(store, proc["id"]) == ["exchange.process.started"]


async def test_step4_a_second_start_on_a_held_mailbox_is_busy_with_the_active_process(client):
    _, proc = await started(client, 1)
    fresh = await put(client, b"new")
    response = await start(client, [fresh["id"]], client_id="gedemin-b")
    assert response.status_code == 409
    assert response.json()["code"] == "busy" and response.json()["active_process_id"] == proc["id"]


async def test_step4_busy_lasts_through_ready_to_commit_and_ends_with_the_process(client):
    _, proc = await started(client, 1)
    fresh = await put(client, b"new")
    await client.post(f"{P}/{proc['id']}/ready")
    assert (await start(client, [fresh["id"]])).json()["code"] == "busy"
    await client.post(f"{P}/{proc['id']}/committed")
    assert (await start(client, [fresh["id"]])).status_code == 201


async def test_step4_other_mailboxes_are_not_busy(client):
    await started(client, 1)
    await started(client, 1, mailbox="/v1/exchange/mailboxes/mobile-a/db-2")


async def test_step7_watchdog_cancels_started_past_deadline_and_messages_come_back(app, client, clock, store):
    ids, proc = await started(client, 2)
    clock.advance(PROCESS_TIMEOUT_MS - 1)
    await settle(app)
    assert (await process(client, proc["id"]))["state"] == "STARTED"
    clock.advance(1)
    await settle(app)
    cancelled = await process(client, proc["id"])
    assert cancelled["state"] == "CANCELLED" and cancelled["deadline"] is None
    page = await listed(client)
    assert [m["id"] for m in page["messages"]] == ids and page["busy"] is False
    assert "exchange.process.cancelled" in await event_types(store, proc["id"])


async def test_step7_heartbeat_moves_the_deadline_and_keeps_the_process(app, client, clock):
    _, proc = await started(client, 1)
    clock.advance(PROCESS_TIMEOUT_MS - 1000)
    beat = await client.post(f"{P}/{proc['id']}/heartbeat")
    assert beat.status_code == 200 and beat.json()["deadline"] > proc["deadline"]
    clock.advance(5000)
    await settle(app)
    assert (await process(client, proc["id"]))["state"] == "STARTED"


async def test_step7_heartbeat_of_a_cancelled_or_unknown_process_is_409_cancelled(app, client, clock):
    _, proc = await started(client, 1)
    clock.advance(PROCESS_TIMEOUT_MS)
    await settle(app)
    for pid in (proc["id"], "p-unknown"):
        response = await client.post(f"{P}/{pid}/heartbeat")
        assert response.status_code == 409 and response.json()["code"] == "cancelled"


async def test_step9_ready_turns_started_into_ready_to_commit_and_answers_ok(client, store):
    _, proc = await started(client, 1)
    response = await client.post(f"{P}/{proc['id']}/ready", json={})
    assert response.status_code == 200
    assert response.json()["status"] == "OK" and response.json()["process"]["state"] == "READY_TO_COMMIT"
    again = await client.post(f"{P}/{proc['id']}/ready")
    assert again.status_code == 200 and again.json()["status"] == "OK"
    assert (await event_types(store, proc["id"])).count("exchange.process.ready") == 1


async def test_step9_ready_of_unknown_or_cancelled_process_is_409_cancelled(app, client, clock):
    _, proc = await started(client, 1)
    clock.advance(PROCESS_TIMEOUT_MS)
    await settle(app)
    for pid in (proc["id"], "p-unknown"):
        response = await client.post(f"{P}/{pid}/ready")
        assert response.status_code == 409 and response.json()["code"] == "cancelled"


async def test_step9_ready_with_or_without_replies_answers_the_same_for_a_process_that_cannot_take_them(client, exchange_dir):
    # Without replies API_3 skips its first look and lets its transaction answer: the same answers either way.
    _, proc = await started(client, 1)
    await client.post(f"{P}/{proc['id']}/commit-failed")
    reply = {"addressee": "mobile-b", "database": "db-1", "body": "r"}
    answers = [await client.post(f"{P}/{pid}/ready", json=body)
               for pid in (proc["id"], "p-unknown") for body in ({}, {"replies": [reply]})]
    assert [a.status_code for a in answers] == [409] * 4
    assert [a.json().get("state") for a in answers] == ["ABORTED", "ABORTED", None, None]
    assert answers[0].json()["detail"] == answers[1].json()["detail"]
    assert answers[2].json()["detail"] == answers[3].json()["detail"]
    assert not files_under(exchange_dir / "mailboxes" / "mobile-b"), "no reply file is left behind"


async def test_step9_ready_after_commit_failed_is_409_cancelled(client):
    _, proc = await started(client, 1)
    await client.post(f"{P}/{proc['id']}/commit-failed")
    response = await client.post(f"{P}/{proc['id']}/ready")
    assert response.status_code == 409 and response.json()["code"] == "cancelled"


async def test_step8_replies_are_stored_at_ready_but_invisible_until_committed(client, exchange_dir):
    _, proc = await started(client, 1)
    out = "/v1/exchange/mailboxes/mobile-b/db-1"
    response = await client.post(f"{P}/{proc['id']}/ready", json={"replies": [
        {"addressee": "mobile-b", "database": "db-1", "body": "answer", "message_id": "r-1"},
        {"addressee": "mobile-b", "database": "db-1", "body_base64": "AAEC", "content_type": "application/x-bin"},
    ]})
    assert response.status_code == 200
    assert (await listed(client, out))["messages"] == []
    assert len(files_under(exchange_dir / "mailboxes" / "mobile-b")) == 2, "replies are on disk already"
    await client.post(f"{P}/{proc['id']}/committed")
    visible = (await listed(client, out))["messages"]
    assert sorted(m["size"] for m in visible) == [3, 6]
    binary = next(m for m in visible if m["size"] == 3)
    assert (await client.get(f"{out}/messages/{binary['id']}")).content == b"\x00\x01\x02"


async def test_step8_a_reply_message_id_stored_already_or_given_twice_stores_one_message(client, exchange_dir):
    out = "/v1/exchange/mailboxes/mobile-b/db-1"
    earlier = await client.post(f"{out}/messages", content=b"answer", headers={"Message-Id": "r-1"})
    assert earlier.status_code == 201
    _, proc = await started(client, 1)
    again = {"addressee": "mobile-b", "database": "db-1", "body": "answer", "message_id": "r-1"}
    twice = {"addressee": "mobile-b", "database": "db-1", "body": "other answer", "message_id": "r-2"}
    response = await client.post(f"{P}/{proc['id']}/ready", json={"replies": [again, twice, twice]})
    assert response.status_code == 200, response.text
    await client.post(f"{P}/{proc['id']}/committed")
    visible = (await listed(client, out))["messages"]
    assert sorted(m["size"] for m in visible) == [6, 12]
    assert visible[0]["id"] == earlier.json()["id"] or visible[1]["id"] == earlier.json()["id"]
    assert len(files_under(exchange_dir / "mailboxes" / "mobile-b")) == 2, "the files of the repeats are discarded"


async def test_step8_bad_replies_are_422_and_the_process_stays_started(client):
    _, proc = await started(client, 1)
    for reply in ({"addressee": "x", "database": "y"}, {"addressee": "x", "database": "y", "body": "a", "body_base64": "AA=="},
                  {"addressee": "../x", "database": "y", "body": "a"}, {"addressee": "x", "database": "y", "body_base64": "!!"}):
        response = await client.post(f"{P}/{proc['id']}/ready", json={"replies": [reply]})
        assert response.status_code == 422, reply
    assert (await process(client, proc["id"]))["state"] == "STARTED"


async def test_step11_12_committed_deletes_the_files_and_ends_done(client, exchange_dir, store):
    ids, proc = await started(client, 2)
    await client.post(f"{P}/{proc['id']}/ready")
    response = await client.post(f"{P}/{proc['id']}/committed")
    assert response.status_code == 200 and response.json()["state"] == "DONE"
    assert files_under(exchange_dir) == set()
    for message_id in ids:
        gone = await client.get(f"{MAILBOX}/messages/{message_id}")
        assert gone.status_code == 404 and gone.json()["code"] == "message_not_found"
    assert await event_types(store, proc["id"]) == [
        "exchange.process.started", "exchange.process.ready", "exchange.process.committed", "exchange.process.done"]


async def test_step12_committed_repeats_answer_the_same(client):
    _, proc = await started(client, 1)
    await client.post(f"{P}/{proc['id']}/ready")
    first = await client.post(f"{P}/{proc['id']}/committed")
    again = await client.post(f"{P}/{proc['id']}/committed")
    assert again.status_code == 200 and again.json() == first.json()


async def test_step12_committed_with_backup_moves_the_files_to_backup(client, app, exchange_dir):
    app.state.context.settings.exchange.backup = True
    ids, proc = await started(client, 1)
    await client.post(f"{P}/{proc['id']}/ready")
    assert (await client.post(f"{P}/{proc['id']}/committed")).json()["state"] == "DONE"
    assert files_under(exchange_dir) == {f"backup/mobile-a/db-1/{ids[0]}"}
    assert (exchange_dir / "backup" / "mobile-a" / "db-1" / ids[0]).read_bytes() == b"msg-0"


async def test_step12_committed_without_permission_is_409_cancelled_and_alerts(app, client, clock, store):
    ids, proc = await started(client, 1)
    early = await client.post(f"{P}/{proc['id']}/committed")
    assert early.status_code == 409 and early.json()["code"] == "cancelled"
    clock.advance(PROCESS_TIMEOUT_MS)
    await settle(app)
    late = await client.post(f"{P}/{proc['id']}/committed")
    assert late.status_code == 409 and late.json()["code"] == "cancelled"
    unknown = await client.post(f"{P}/p-unknown/committed")
    assert unknown.status_code == 409 and unknown.json()["code"] == "cancelled"
    alerts = await open_alerts(store, "exchange_commit_not_allowed")
    assert {a.subject_id for a in alerts} == {proc["id"], "p-unknown"}
    assert [m["id"] for m in (await listed(client))["messages"]] == ids


async def test_step13_commit_failed_aborts_and_makes_the_messages_available_again(client, exchange_dir, store):
    ids, proc = await started(client, 2)
    await client.post(f"{P}/{proc['id']}/ready", json={"replies": [{"addressee": "mobile-b", "database": "db-1", "body": "r"}]})
    response = await client.post(f"{P}/{proc['id']}/commit-failed", json={"error": "deadlock"})
    assert response.status_code == 200
    assert response.json()["state"] == "ABORTED" and response.json()["error"] == "deadlock"
    page = await listed(client)
    assert [m["id"] for m in page["messages"]] == ids and page["busy"] is False
    assert (await listed(client, "/v1/exchange/mailboxes/mobile-b/db-1"))["messages"] == []
    assert files_under(exchange_dir / "mailboxes" / "mobile-b") == set(), "discarded replies are deleted"
    again = await client.post(f"{P}/{proc['id']}/commit-failed")
    assert again.status_code == 200 and again.json()["state"] == "ABORTED"
    assert "exchange.process.aborted" in await event_types(store, proc["id"])


async def test_step13_commit_failed_after_committed_is_409_and_alerts(client, store):
    _, proc = await started(client, 1)
    await client.post(f"{P}/{proc['id']}/ready")
    await client.post(f"{P}/{proc['id']}/committed")
    response = await client.post(f"{P}/{proc['id']}/commit-failed")
    assert response.status_code == 409 and response.json()["code"] == "already_committed"
    assert await open_alerts(store, "exchange_commit_contradiction")


async def test_ready_to_commit_past_commit_timeout_turns_in_doubt_quarantined_and_alerted(app, client, clock, exchange_dir, store):
    ids, proc = await started(client, 2)
    await client.post(f"{P}/{proc['id']}/ready")
    clock.advance(COMMIT_TIMEOUT_MS)
    await settle(app)
    doubt = await process(client, proc["id"])
    assert doubt["state"] == "IN_DOUBT"
    assert files_under(exchange_dir) == {f"unknown/{proc['id']}/{i}" for i in ids}
    page = await listed(client)
    assert page["messages"] == [] and page["busy"] is False, "IN_DOUBT does not hold the mailbox"
    alerts = await open_alerts(store, "exchange_in_doubt")
    assert [a.subject_id for a in alerts] == [proc["id"]]
    assert "exchange.process.in_doubt" in await event_types(store, proc["id"])
    fresh = await put(client, b"fresh")
    assert (await start(client, [fresh["id"]])).status_code == 201


async def test_late_committed_resolves_in_doubt_to_done(app, client, clock, exchange_dir):
    _ids, proc = await started(client, 1)
    await client.post(f"{P}/{proc['id']}/ready", json={"replies": [{"addressee": "mobile-b", "database": "db-1", "body": "r"}]})
    clock.advance(COMMIT_TIMEOUT_MS)
    await settle(app)
    response = await client.post(f"{P}/{proc['id']}/committed")
    assert response.status_code == 200 and response.json()["state"] == "DONE"
    assert not (exchange_dir / "unknown" / proc["id"]).exists()
    assert len((await listed(client, "/v1/exchange/mailboxes/mobile-b/db-1"))["messages"]) == 1


async def test_late_commit_failed_moves_in_doubt_messages_back_from_unknown(app, client, clock, exchange_dir):
    ids, proc = await started(client, 2)
    await client.post(f"{P}/{proc['id']}/ready")
    clock.advance(COMMIT_TIMEOUT_MS)
    await settle(app)
    response = await client.post(f"{P}/{proc['id']}/commit-failed")
    assert response.json()["state"] == "ABORTED"
    assert files_under(exchange_dir) == {f"mailboxes/mobile-a/db-1/{i}" for i in ids}
    assert [m["id"] for m in (await listed(client))["messages"]] == ids
    assert (await client.get(f"{MAILBOX}/messages/{ids[0]}")).content == b"msg-0"


async def test_in_doubt_messages_stay_readable_from_unknown(app, client, clock):
    ids, proc = await started(client, 1)
    await client.post(f"{P}/{proc['id']}/ready")
    clock.advance(COMMIT_TIMEOUT_MS)
    await settle(app)
    assert (await client.get(f"{MAILBOX}/messages/{ids[0]}")).content == b"msg-0"


async def test_resolve_is_409_not_in_doubt_unless_in_doubt(client):
    _, proc = await started(client, 1)
    response = await client.post(f"{P}/{proc['id']}/resolve", json={"committed": True})
    assert response.status_code == 409 and response.json()["code"] == "not_in_doubt"
    assert (await client.post(f"{P}/p-unknown/resolve", json={"committed": True})).status_code == 404
    assert (await client.post(f"{P}/{proc['id']}/resolve", json={"committed": "yes"})).status_code == 422


async def test_resolve_committed_and_not_committed_act_as_api4_and_api5(app, client, clock, store):
    _ids_a, a = await started(client, 1)
    await client.post(f"{P}/{a['id']}/ready")
    ids_b, b = await started(client, 1, mailbox="/v1/exchange/mailboxes/mobile-a/db-2")
    await client.post(f"{P}/{b['id']}/ready")
    clock.advance(COMMIT_TIMEOUT_MS)
    await settle(app)
    done = await client.post(f"{P}/{a['id']}/resolve", json={"committed": True})
    assert done.status_code == 200 and done.json()["state"] == "DONE"
    aborted = await client.post(f"{P}/{b['id']}/resolve", json={"committed": False})
    assert aborted.json()["state"] == "ABORTED"
    assert [m["id"] for m in (await listed(client, "/v1/exchange/mailboxes/mobile-a/db-2"))["messages"]] == ids_b
    assert "exchange.process.resolved" in await event_types(store, a["id"])
    assert (await client.post(f"{P}/{a['id']}/resolve", json={"committed": True})).json()["code"] == "not_in_doubt"


async def test_inspect_unknown_process_is_404_and_list_filters_by_state(client):
    response = await client.get(f"{P}/p-nothing")
    assert response.status_code == 404 and response.json()["code"] == "process_not_found"
    _, a = await started(client, 1)
    _, b = await started(client, 1, mailbox="/v1/exchange/mailboxes/mobile-a/db-2")
    await client.post(f"{P}/{b['id']}/commit-failed")
    assert [p["id"] for p in (await client.get(f"{P}?state=STARTED")).json()["processes"]] == [a["id"]]
    assert [p["id"] for p in (await client.get(f"{P}?state=ABORTED&addressee=mobile-a")).json()["processes"]] == [b["id"]]
    assert (await client.get(f"{P}?state=WAITING")).status_code == 422


async def test_start_ready_and_committed_answer_the_process_as_stored(client):
    """Start and ready build their answers from what the transition wrote, not read back: each must equal a
    later read; committed answers the process once DONE."""
    ids, proc = await started(client, 2)
    assert proc == await process(client, proc["id"])
    assert proc["message_ids"] == ids and proc["state"] == "STARTED"
    ready = (await client.post(f"{P}/{proc['id']}/ready")).json()["process"]
    assert ready == await process(client, proc["id"]) and ready["state"] == "READY_TO_COMMIT"
    committed = (await client.post(f"{P}/{proc['id']}/committed")).json()
    assert committed["state"] == "DONE" and committed == await process(client, proc["id"])


async def test_a_reply_whose_content_type_cannot_go_out_as_a_header_is_422_and_the_process_stays_started(client):
    _, proc = await started(client, 1)
    for content_type in ("text/html\r\nX-Injected: yes", "text/plain; charset=€", "text/plain; charset=no-such-charset",
                         "html", "text/plain\x00", "text/plain; charset"):
        reply = {"addressee": "mobile-b", "database": "db-1", "body": "<b>hi</b>", "content_type": content_type}
        response = await client.post(f"{P}/{proc['id']}/ready", json={"replies": [reply]})
        assert response.status_code == 422 and response.json()["code"] == "invalid_request", content_type
    assert (await process(client, proc["id"]))["state"] == "STARTED"


async def test_a_committed_reply_is_read_with_its_media_type_and_nosniff(client):
    _, proc = await started(client, 1)
    reply = {"addressee": "mobile-b", "database": "db-1", "body": "<b>hi</b>", "content_type": 'text/html; charset="windows-1251"'}
    assert (await client.post(f"{P}/{proc['id']}/ready", json={"replies": [reply]})).status_code == 200
    await client.post(f"{P}/{proc['id']}/committed")
    out = "/v1/exchange/mailboxes/mobile-b/db-1"
    [message] = (await listed(client, out))["messages"]
    read = await client.get(f"{out}/messages/{message['id']}")
    assert read.status_code == 200 and read.content == b"<b>hi</b>"
    assert read.headers["content-type"] == 'text/html; charset="windows-1251"'
    assert read.headers["x-content-type-options"] == "nosniff"


async def test_an_empty_reply_body_is_422(client):
    _, proc = await started(client, 1)
    for reply in ({"addressee": "mobile-b", "database": "db-1", "body": ""}, {"addressee": "mobile-b", "database": "db-1", "body_base64": ""}):
        response = await client.post(f"{P}/{proc['id']}/ready", json={"replies": [reply]})
        assert response.status_code == 422, reply
