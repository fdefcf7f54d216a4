"""Seed 004 §1 (create and finish), §6 (related interactions), §9 (bus) and §10 (message id), over HTTP."""

from __future__ import annotations

import asyncio

import httpx

from mainspring.core.paging import encode_cursor
from mainspring.store import ManualClock, Store, format_time
from tests.interactions.conftest import create, events_of, get, lease, release


async def test_1_1_create_interaction(client: httpx.AsyncClient) -> None:
    item = await create(client, data={"text": "hi"}, channel="sms", user="u-1", source="app")
    assert item["status"] == "ready"
    assert item["data"] == {"text": "hi"}
    assert (item["channel"], item["user"], item["source"], item["queue"]) == ("sms", "u-1", "app", "q")
    assert await get(client, item["id"]) == item


async def test_1_2_create_child_interaction_with_parent_and_name(client: httpx.AsyncClient) -> None:
    parent = await create(client)
    child = await create(client, parent_id=parent["id"], name="ask")
    assert (child["parent_id"], child["name"]) == (parent["id"], "ask")
    missing = await client.post("/v1/queues/q/interactions", json={"parent_id": "999999"})
    assert missing.status_code == 404 and missing.json()["code"] == "parent_not_found"


async def test_1_3_complete_interaction(client: httpx.AsyncClient) -> None:
    item = await create(client)
    done = (await client.post(f"/v1/interactions/{item['id']}/complete", json={"result": {"ok": 1}})).json()
    assert (done["status"], done["result"], done["next_processing"]) == ("completed", {"ok": 1}, None)
    again = await client.post(f"/v1/interactions/{item['id']}/complete", json={})
    assert again.status_code == 409 and again.json()["code"] == "interaction_finished"


async def test_1_4_fail_interaction(client: httpx.AsyncClient) -> None:
    item = await create(client)
    failed = (await client.post(f"/v1/interactions/{item['id']}/fail", json={"error": "no such user"})).json()
    assert (failed["status"], failed["error"]) == ("failed", "no such user")
    again = await client.post(f"/v1/interactions/{item['id']}/fail", json={"error": "x"})
    assert again.status_code == 409 and again.json()["code"] == "interaction_finished"


async def test_1_5_cancel_interaction(client: httpx.AsyncClient) -> None:
    item = await create(client)
    cancelled = (await client.post(f"/v1/interactions/{item['id']}/cancel")).json()
    assert cancelled["status"] == "cancelled"
    assert await lease(client) == []
    again = await client.post(f"/v1/interactions/{item['id']}/cancel")
    assert again.status_code == 409 and again.json()["code"] == "interaction_finished"


async def test_1_6_schedule_at_utc_time(client: httpx.AsyncClient, clock: ManualClock) -> None:
    at = format_time(clock.now_ms() + 60_000)
    item = await create(client, process_at=at)
    assert (item["status"], item["next_processing"]) == ("scheduled", at)
    assert await lease(client) == []
    clock.advance(60_000)
    assert [i["id"] for i in await lease(client)] == [item["id"]]
    later = await create(client)
    moved = (await client.post(f"/v1/interactions/{later['id']}/schedule", json={"process_at": format_time(clock.now_ms() + 5000)})).json()
    assert moved["status"] == "scheduled"


async def test_1_7_schedule_in_interval_ms(client: httpx.AsyncClient, clock: ManualClock) -> None:
    item = await create(client, process_in_ms=30_000)
    assert item["next_processing"] == format_time(clock.now_ms() + 30_000)
    clock.advance(29_999)
    assert await lease(client) == []
    clock.advance(1)
    assert len(await lease(client)) == 1
    other = await create(client)
    moved = (await client.post(f"/v1/interactions/{other['id']}/schedule", json={"process_in_ms": 1000})).json()
    assert moved["next_processing"] == format_time(clock.now_ms() + 1000)
    done = (await client.post(f"/v1/interactions/{other['id']}/complete", json={})).json()
    refused = await client.post(f"/v1/interactions/{done['id']}/schedule", json={"process_in_ms": 1})
    assert refused.status_code == 409 and refused.json()["code"] == "interaction_finished"


async def test_6_1_finishing_a_child_makes_its_parent_due_now(client: httpx.AsyncClient, clock: ManualClock) -> None:
    parent = await create(client)
    [leased] = await lease(client)
    await release(client, leased, {"wait": {}})
    assert (await get(client, parent["id"]))["status"] == "waiting"
    ok_child = await create(client, parent_id=parent["id"], name="a")
    await client.post(f"/v1/interactions/{ok_child['id']}/complete", json={"result": 1})
    assert (await get(client, parent["id"]))["status"] == "ready"
    [leased] = await lease(client)
    assert leased["id"] == parent["id"]
    await release(client, leased, {"wait": {}})
    failing = await create(client, parent_id=parent["id"], name="b")
    # A failed child wakes its parent too: a parent never waits on a dead child.
    await client.post(f"/v1/interactions/{failing['id']}/fail", json={"error": "boom"})
    assert (await get(client, parent["id"]))["status"] == "ready"


async def test_6_1_a_cancelled_child_does_not_wake_its_parent(client: httpx.AsyncClient) -> None:
    parent = await create(client)
    [leased] = await lease(client)
    await release(client, leased, {"wait": {}})
    child = await create(client, parent_id=parent["id"])
    await client.post(f"/v1/interactions/{child['id']}/cancel")
    assert (await get(client, parent["id"]))["status"] == "waiting"


async def test_6_1_a_child_finishing_while_its_parent_is_processed_is_not_lost(client: httpx.AsyncClient) -> None:
    parent = await create(client)
    [leased] = await lease(client)
    child = await create(client, queue="other", parent_id=parent["id"])
    await client.post(f"/v1/interactions/{child['id']}/complete", json={})
    after = await release(client, leased, {"wait": {}})
    assert after["status"] == "ready"


async def test_6_2_finishing_a_parent_cancels_its_unfinished_children(client: httpx.AsyncClient) -> None:
    parent = await create(client, queue="p")
    open_child = await create(client, parent_id=parent["id"])
    grandchild = await create(client, parent_id=open_child["id"])
    done_child = await create(client, parent_id=parent["id"], completed=True, result=1)
    await client.post(f"/v1/interactions/{parent['id']}/complete", json={})
    assert (await get(client, open_child["id"]))["status"] == "cancelled"
    assert (await get(client, grandchild["id"]))["status"] == "cancelled"
    assert (await get(client, done_child["id"]))["status"] == "completed"


async def test_6_2_a_cancelled_child_being_processed_loses_its_lease(client: httpx.AsyncClient) -> None:
    parent = await create(client, queue="p")
    await create(client, parent_id=parent["id"])
    [child] = await lease(client)
    await client.post(f"/v1/interactions/{parent['id']}/cancel")
    lost = await client.post(f"/v1/interactions/{child['id']}/release", json={"token": child["lease"]["token"], "outcome": {"complete": {}}})
    assert lost.status_code == 409 and lost.json()["code"] == "lease_lost"


async def test_6_3_latest_child_by_name(client: httpx.AsyncClient, clock: ManualClock) -> None:
    parent = await create(client)
    await create(client, parent_id=parent["id"], name="ask", data=1)
    clock.advance(1)
    newest = await create(client, parent_id=parent["id"], name="ask", data=2)
    clock.advance(1)
    await create(client, parent_id=parent["id"], name="other", data=3)
    latest = (await client.get(f"/v1/interactions/{parent['id']}/children/latest", params={"name": "ask"})).json()
    assert latest["id"] == newest["id"]
    none = await client.get(f"/v1/interactions/{parent['id']}/children/latest", params={"name": "nope"})
    assert none.status_code == 404 and none.json()["code"] == "interaction_not_found"
    assert (await client.get("/v1/interactions/424242/children/latest")).status_code == 404


async def test_6_4_children_by_name_oldest_first(client: httpx.AsyncClient, clock: ManualClock) -> None:
    parent = await create(client)
    made = []
    for i in range(5):
        made.append((await create(client, parent_id=parent["id"], name="ask", data=i))["id"])
        clock.advance(1)
    await create(client, parent_id=parent["id"], name="other")
    page = (await client.get(f"/v1/interactions/{parent['id']}/children", params={"name": "ask", "limit": 3})).json()
    rest = (await client.get(f"/v1/interactions/{parent['id']}/children", params={"name": "ask", "cursor": page["next_cursor"]})).json()
    assert [i["id"] for i in page["interactions"] + rest["interactions"]] == made
    assert rest["next_cursor"] is None
    everyone = (await client.get(f"/v1/interactions/{parent['id']}/children")).json()
    assert len(everyone["interactions"]) == 6


async def test_6_5_child_created_completed_makes_parent_due(client: httpx.AsyncClient) -> None:
    parent = await create(client)
    [leased] = await lease(client)
    await release(client, leased, {"wait": {}})
    child = await create(client, parent_id=parent["id"], completed=True, result={"answer": 42})
    assert (child["status"], child["result"]) == ("completed", {"answer": 42})
    assert (await get(client, parent["id"]))["status"] == "ready"


async def test_9_1_event_interaction_created(client: httpx.AsyncClient, store: Store) -> None:
    item = await create(client)
    [event] = [e for e in await events_of(client, store, "interaction.created")]
    assert event["subject"] == {"kind": "interaction", "id": item["id"]}
    assert event["data"]["queue"] == "q"


async def test_9_2_event_interaction_completed_with_failed_flag(client: httpx.AsyncClient, store: Store) -> None:
    ok = await create(client)
    bad = await create(client)
    await client.post(f"/v1/interactions/{ok['id']}/complete", json={})
    await client.post(f"/v1/interactions/{bad['id']}/fail", json={"error": "e"})
    done = {e["subject"]["id"]: e["data"]["failed"] for e in await events_of(client, store, "interaction.completed")}
    assert done == {ok["id"]: False, bad["id"]: True}
    cancelled = await create(client)
    await client.post(f"/v1/interactions/{cancelled['id']}/cancel")
    assert [e["subject"]["id"] for e in await events_of(client, store, "interaction.cancelled")] == [cancelled["id"]]


async def test_9_3_event_interaction_changed(client: httpx.AsyncClient, store: Store) -> None:
    item = await create(client)
    await client.post(f"/v1/interactions/{item['id']}/schedule", json={"process_in_ms": 1000})
    changed = [e for e in await events_of(client, store, "interaction.changed") if e["subject"]["id"] == item["id"]]
    assert changed and changed[-1]["data"]["status"] == "scheduled"


async def test_10_1_message_id_is_unique_per_queue(client: httpx.AsyncClient) -> None:
    first = await create(client, message_id="m-1", data=1)
    again = await create(client, expect=200, message_id="m-1", data=2)
    assert again == first
    other_queue = await create(client, queue="q2", message_id="m-1")
    assert other_queue["id"] != first["id"]
    found = (await client.get("/v1/queues/q/interactions", params={"message_id": "m-1"})).json()
    assert [i["id"] for i in found["interactions"]] == [first["id"]]


async def test_10_1_racing_creates_with_one_message_id_make_one_interaction(client: httpx.AsyncClient) -> None:
    answers = await asyncio.gather(*(client.post("/v1/queues/q/interactions", json={"message_id": "race"}) for _ in range(10)))
    assert sorted(a.status_code for a in answers) == [200] * 9 + [201]
    assert len({a.json()["id"] for a in answers}) == 1


async def test_list_filters_and_cursor_paging(client: httpx.AsyncClient) -> None:
    ids = [(await create(client, channel="a" if i % 2 else "b", user="u"))["id"] for i in range(7)]
    await client.post(f"/v1/interactions/{ids[0]}/complete", json={})
    page = (await client.get("/v1/queues/q/interactions", params={"limit": 4})).json()
    rest = (await client.get("/v1/queues/q/interactions", params={"limit": 4, "cursor": page["next_cursor"]})).json()
    assert [i["id"] for i in page["interactions"] + rest["interactions"]] == ids
    by_channel = (await client.get("/v1/queues/q/interactions", params={"channel": "a"})).json()
    assert [i["id"] for i in by_channel["interactions"]] == ids[1::2]
    ready = (await client.get("/v1/queues/q/interactions", params={"status": "ready"})).json()
    assert [i["id"] for i in ready["interactions"]] == ids[1:]
    bad = await client.get("/v1/queues/q/interactions", params={"status": "nope"})
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_request"
    # A cursor is its sort key in the open: anything not of its shape (core.paging) is refused.
    for forged in ("!!", encode_cursor("x"), encode_cursor(-1), encode_cursor(2**70), encode_cursor(2**70, 1), "1.5.2"):
        assert (await client.get("/v1/queues/q/interactions", params={"cursor": forged})).status_code == 422
        assert (await client.get(f"/v1/interactions/{ids[1]}/children", params={"cursor": forged})).status_code == 422


async def test_bad_input_is_422_and_unknown_ids_404(client: httpx.AsyncClient) -> None:
    assert (await client.post("/v1/queues/bad%20name/interactions", json={})).status_code == 422
    both = await client.post("/v1/queues/q/interactions", json={"process_at": "2030-01-01T00:00:00Z", "process_in_ms": 5})
    assert both.status_code == 422
    assert (await client.post("/v1/queues/q/interactions", json={"data": "a\u0000b"})).status_code == 422
    assert (await client.post("/v1/queues/q/interactions", json={"surprise": 1})).status_code == 422
    unstorable = ['{"data": NaN}', '{"data": Infinity}', '{"data": 1e400}', '{"data": {"a": "\\ud800"}}', '{"parent_id": true}', '[]']
    for raw in unstorable:
        refused = await client.post("/v1/queues/q/interactions", content=raw, headers={"content-type": "application/json"})
        assert refused.status_code == 422 and refused.json()["code"] == "invalid_request", raw
    for path in ("/v1/interactions/abc", "/v1/interactions/99999999999999999999999", "/v1/interactions/123"):
        missing = await client.get(path)
        assert missing.status_code == 404 and missing.json()["code"] == "interaction_not_found"
    bad_outcome = await client.post("/v1/interactions/1/release", json={"token": "t", "outcome": {"complete": {}, "wait": {}}})
    assert bad_outcome.status_code == 422


async def test_read_with_wait_ms_answers_when_finished(client: httpx.AsyncClient) -> None:
    item = await create(client)

    async def finish_soon() -> None:
        await asyncio.sleep(0.1)
        await client.post(f"/v1/interactions/{item['id']}/complete", json={"result": "done"})

    task = asyncio.create_task(finish_soon())
    started = asyncio.get_running_loop().time()
    waited = (await client.get(f"/v1/interactions/{item['id']}", params={"wait_ms": 10_000})).json()
    await task
    assert waited["status"] == "completed" and waited["result"] == "done"
    assert asyncio.get_running_loop().time() - started < 5


async def test_concurrent_creates_commit_together_and_errors_stay_per_request(client: httpx.AsyncClient) -> None:
    bodies = [{"data": i} for i in range(20)] + [{"parent_id": "987654"}]
    answers = await asyncio.gather(*(client.post("/v1/queues/q/interactions", json=b) for b in bodies))
    assert [a.status_code for a in answers] == [201] * 20 + [404]
    assert [a.json()["data"] for a in answers[:20]] == list(range(20))
    assert answers[20].json()["code"] == "parent_not_found"
    listed = (await client.get("/v1/queues/q/interactions")).json()["interactions"]
    assert len(listed) == 20


async def test_9_list_by_user_and_by_source_finds_exactly_those_items(client: httpx.AsyncClient) -> None:
    """Seed 004 §9: interactions are found by who they are for (user) and where they came from (source)."""
    made = [
        (await create(client, user=user, source=source))["id"]
        for user, source in (("ada", "app"), ("bob", "app"), ("ada", "mail"), ("cy", "web"))
    ]
    by_user = (await client.get("/v1/queues/q/interactions", params={"user": "ada"})).json()["interactions"]
    assert [i["id"] for i in by_user] == [made[0], made[2]]
    by_source = (await client.get("/v1/queues/q/interactions", params={"source": "app"})).json()["interactions"]
    assert [i["id"] for i in by_source] == [made[0], made[1]]
    both = (await client.get("/v1/queues/q/interactions", params={"user": "ada", "source": "mail"})).json()["interactions"]
    assert [i["id"] for i in both] == [made[2]]
    assert (await client.get("/v1/queues/q/interactions", params={"user": "nobody"})).json()["interactions"] == []


async def test_9_3_changed_data_replaces_the_old_and_is_an_event(client: httpx.AsyncClient, store: Store) -> None:
    """Seed 004 item 9.3: an unfinished interaction's data is changed; the change is an event with the new data."""
    item = await create(client, data={"step": 1})
    changed = await client.patch(f"/v1/interactions/{item['id']}", json={"data": {"step": 2}})
    assert changed.status_code == 200 and changed.json()["data"] == {"step": 2}
    assert (await get(client, item["id"]))["data"] == {"step": 2}
    assert {"type": "interaction.changed", "data": {"step": 2}} in [
        {"type": e["type"], "data": e["data"].get("data")} for e in await events_of(client, store) if e["subject"]["id"] == item["id"]
    ]
    await client.post(f"/v1/interactions/{item['id']}/complete", json={})
    finished = await client.patch(f"/v1/interactions/{item['id']}", json={"data": {"step": 3}})
    assert finished.status_code == 409 and finished.json()["code"] == "interaction_finished"
    assert (await client.patch("/v1/interactions/999999", json={"data": 1})).status_code == 404
    assert (await client.patch(f"/v1/interactions/{item['id']}", json={"nope": 1})).status_code == 422


async def test_a_failed_interaction_is_retried_with_attempts_reset_and_its_error_kept(client: httpx.AsyncClient, store: Store) -> None:
    item = await create(client)
    [held] = await lease(client)
    await release(client, held, {"fail": {"error": "boom"}})
    retried = await client.post(f"/v1/interactions/{item['id']}/retry", json={})
    assert retried.status_code == 200, retried.text
    body = retried.json()
    assert (body["status"], body["attempts"], body["error"]) == ("ready", 0, "boom")
    assert "interaction.retried" in [e["type"] for e in await events_of(client, store) if e["subject"]["id"] == item["id"]]
    again = await client.post(f"/v1/interactions/{item['id']}/retry", json={})
    assert again.status_code == 409 and again.json()["code"] == "interaction_not_finished"
    [held] = await lease(client)
    await release(client, held, {"complete": {"result": 1}})
    done = await client.post(f"/v1/interactions/{item['id']}/retry", json={})
    assert done.status_code == 409 and done.json()["code"] == "interaction_finished"
    later = await create(client)
    await client.post(f"/v1/interactions/{later['id']}/cancel")
    scheduled = (await client.post(f"/v1/interactions/{later['id']}/retry", json={"process_in_ms": 60_000})).json()
    assert scheduled["status"] == "scheduled"
