"""Many leases of one queue heartbeated or released in one call (`POST /v1/queues/{queue}/heartbeat`,
`…/release`): what a worker through the HTTP API sends once per batch instead of once per item."""

from __future__ import annotations

from typing import Any

import httpx

from mainspring.config import Settings
from mainspring.interactions.models import InteractionList
from mainspring.store import ManualClock, Store
from tests.interactions.conftest import clients_with_tokens, create, events_of, get, lease, put_queue


def _release(item: dict[str, Any], outcome: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    return {"id": item["id"], "token": token or item["lease"]["token"], "outcome": outcome}


async def test_a_batch_release_stores_each_outcome_and_answers_which_leases_were_held(client: httpx.AsyncClient, store: Store) -> None:
    await put_queue(client, error_delay_ms=1000, max_attempts=3)
    for n in range(5):
        await create(client, data={"n": n})
    done, failed, again, retried, stale = await lease(client, max=5)
    answer = await client.post("/v1/queues/q/release", json={"releases": [
        _release(done, {"complete": {"result": {"ok": 1}}}),
        _release(failed, {"fail": {"error": "bad"}}),
        _release(again, {"repeat": {"in_ms": 500}}),
        _release(retried, {"retry": {"error": "flaky"}}),
        _release(stale, {"complete": {}}, token="not-the-token"),
    ]})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"released": [done["id"], failed["id"], again["id"], retried["id"]], "lease_lost": [stale["id"]]}
    assert (await get(client, done["id"]))["result"] == {"ok": 1}
    assert (await get(client, failed["id"]))["status"] == "failed"
    assert (await get(client, again["id"]))["status"] == "scheduled"
    assert (await get(client, retried["id"]))["error"] == "flaky"
    assert (await get(client, stale["id"]))["status"] == "processing"
    finished = {e["subject"]["id"]: e["data"]["failed"] for e in await events_of(client, store, "interaction.completed")}
    assert finished == {done["id"]: False, failed["id"]: True}


async def test_a_batch_release_repeated_changes_nothing_the_second_time(client: httpx.AsyncClient) -> None:
    await create(client)
    (held,) = await lease(client, max=1)
    body = {"releases": [_release(held, {"complete": {"result": "first"}})]}
    assert (await client.post("/v1/queues/q/release", json=body)).json() == {"released": [held["id"]], "lease_lost": []}
    assert (await client.post("/v1/queues/q/release", json=body)).json() == {"released": [], "lease_lost": [held["id"]]}
    assert (await get(client, held["id"]))["result"] == "first"


async def test_items_of_another_queue_or_unknown_ids_are_answered_as_not_held_and_change_nothing(client: httpx.AsyncClient) -> None:
    await create(client, queue="other")
    (theirs,) = await lease(client, queue="other", max=1)
    answer = await client.post("/v1/queues/q/release", json={"releases": [
        _release(theirs, {"complete": {}}),
        {"id": "999999", "token": "t", "outcome": {"complete": {}}},
        {"id": "not-a-number", "token": "t", "outcome": {"complete": {}}},
    ]})
    assert answer.json() == {"released": [], "lease_lost": [theirs["id"], "999999", "not-a-number"]}
    assert (await get(client, theirs["id"]))["status"] == "processing"
    beat = await client.post("/v1/queues/q/heartbeat", json={"leases": [{"id": theirs["id"], "token": theirs["lease"]["token"]}]})
    assert beat.json() == {"held": [], "lease_lost": [theirs["id"]]}


async def test_a_batch_heartbeat_extends_the_leases_still_held(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await put_queue(client, lease_ms=1000, error_delay_ms=0)
    await create(client)
    await create(client)
    kept, lost = await lease(client, max=2)
    clock.advance(1500)
    taken_again = await lease(client, max=2)  # the expired leases are taken by another worker
    assert len(taken_again) == 2
    mine = {i["id"]: i for i in taken_again}
    clock.advance(800)
    beat = await client.post("/v1/queues/q/heartbeat", json={"leases": [
        {"id": kept["id"], "token": mine[kept["id"]]["lease"]["token"]},
        {"id": lost["id"], "token": lost["lease"]["token"]},
    ], "lease_ms": 5000})
    assert beat.json() == {"held": [kept["id"]], "lease_lost": [lost["id"]]}
    clock.advance(3000)
    assert (await get(client, kept["id"]))["status"] == "processing"
    # Only the lapsed lease is taken again: the extended one still holds.
    assert [i["id"] for i in await lease(client, max=2)] == [lost["id"]]


async def test_bad_batches_are_refused_with_422_and_change_nothing(client: httpx.AsyncClient) -> None:
    await create(client)
    (held,) = await lease(client, max=1)
    for body in (
        {"releases": []},
        {"releases": [_release(held, {"complete": {}, "fail": {"error": "x"}})]},
        {"releases": [_release(held, {"complete": {}})] * 1001},
        {"leases": []},
    ):
        path = "/v1/queues/q/release" if "releases" in body else "/v1/queues/q/heartbeat"
        answer = await client.post(path, json=body)
        assert answer.status_code == 422 and answer.json()["code"] == "invalid_request", answer.text
    assert (await get(client, held["id"]))["status"] == "processing"


async def test_a_token_scoped_to_one_queue_cannot_release_through_another(settings: Settings, store: Store) -> None:
    async with clients_with_tokens(settings, store, {"tok-a": ["queues:alpha"], "tok-admin": ["admin"]}) as clients:
        a, admin = clients["tok-a"], clients["tok-admin"]
        await admin.post("/v1/queues/beta/interactions", json={})
        (theirs,) = (await admin.post("/v1/queues/beta/lease", json={"worker": "w", "max": 1})).json()["interactions"]
        refused = await a.post("/v1/queues/beta/release", json={"releases": [_release(theirs, {"complete": {}})]})
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
        through_mine = await a.post("/v1/queues/alpha/release", json={"releases": [_release(theirs, {"complete": {}})]})
        assert through_mine.json() == {"released": [], "lease_lost": [theirs["id"]]}
        assert (await admin.get(f"/v1/interactions/{theirs['id']}")).json()["status"] == "processing"


async def test_a_lease_answers_byte_for_byte_what_its_declared_model_sends(client: httpx.AsyncClient, clock: ManualClock) -> None:
    # The lease's answer skips building the models (web.routing.AsDeclared): its bytes must still be theirs,
    # field order, nulls, numbers, text and a failed attempt's error detail included.
    await put_queue(client, error_delay_ms=1000, max_attempts=5)
    datas = [{"n": 1, "x": 1.5, "big": 2**60, "text": "é ✓ \"q\"", "nested": [None, True, {"e": 1e-7}]}, "plain", None, [1, 2.25e16]]
    for data in datas:
        await create(client, data=data, name="job", user="u1", priority=3)
    (first,) = await lease(client, max=1)
    detail = {"type": "ValueError", "message": "bad", "traceback": "Traceback …"}
    retried = await client.post("/v1/queues/q/release", json={"releases": [
        _release(first, {"retry": {"error": "flaky", "error_detail": detail}})]})
    assert retried.status_code == 200, retried.text
    clock.advance(2000)
    answer = await client.post("/v1/queues/q/lease", json={"worker": "w1", "max": 10})
    assert answer.status_code == 200, answer.text
    items = answer.json()["interactions"]
    assert len(items) == len(datas) and any(i["error_detail"] == detail for i in items)
    assert answer.content == InteractionList.model_validate_json(answer.content).model_dump_json(by_alias=True).encode()
