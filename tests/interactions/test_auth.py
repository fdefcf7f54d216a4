"""Scopes: a token sees only the queues its `queues:<queue>` scopes name."""

from __future__ import annotations

from typing import Any

from mainspring.config import Settings
from mainspring.store import Store
from tests.interactions.conftest import clients_with_tokens


async def test_queue_scopes_limit_what_a_token_touches(settings: Settings, store: Store) -> None:
    async with clients_with_tokens(settings, store, {"tok-a": ["queues:a*"], "tok-admin": ["admin"], "": []}) as clients:
        a, admin, anonymous = clients["tok-a"], clients["tok-admin"], clients[""]
        mine = await a.post("/v1/queues/alpha/interactions", json={})
        assert mine.status_code == 201
        assert (await a.post("/v1/queues/beta/interactions", json={})).status_code == 403
        theirs: dict[str, Any] = (await admin.post("/v1/queues/beta/interactions", json={})).json()
        for call in (a.get(f"/v1/interactions/{theirs['id']}"), a.post(f"/v1/interactions/{theirs['id']}/cancel")):
            answer = await call
            # Another queue's item is answered as an unknown one: its existence does not leak.
            assert answer.status_code == 404 and answer.json()["code"] == "interaction_not_found"
        leased = (await admin.post("/v1/queues/beta/lease", json={"worker": "w", "max": 1})).json()["interactions"]
        steal = await a.post(f"/v1/interactions/{theirs['id']}/release", json={"token": leased[0]["lease"]["token"], "outcome": {"complete": {}}})
        assert steal.status_code == 404
        assert (await a.get(f"/v1/interactions/{mine.json()['id']}")).status_code == 200
        assert (await anonymous.get("/v1/queues/alpha")).status_code == 401


async def test_a_token_may_not_take_over_another_queues_schedule(settings: Settings, store: Store) -> None:
    """Finding 2: the schedule's stored queue is checked, not only the queue its new body names."""
    async with clients_with_tokens(settings, store, {"emails": ["queues:emails"], "other": ["queues:other"]}) as clients:
        theirs = await clients["other"].put("/v1/periodic/nightly", json={"cron": "0 3 * * *", "queue": "other"})
        assert theirs.status_code == 200
        takeover = await clients["emails"].put("/v1/periodic/nightly", json={"cron": "* * * * *", "queue": "emails"})
        assert takeover.status_code == 403 and takeover.json()["code"] == "forbidden"
        kept = await clients["other"].get("/v1/periodic/nightly")
        assert kept.status_code == 200 and (kept.json()["queue"], kept.json()["cron"]) == ("other", "0 3 * * *")
        # Its own new schedule, and moving it into a queue it may not use, behave as before.
        assert (await clients["emails"].put("/v1/periodic/mine", json={"cron": "* * * * *", "queue": "emails"})).status_code == 200
        assert (await clients["emails"].put("/v1/periodic/mine", json={"cron": "* * * * *", "queue": "other"})).status_code == 403


async def test_the_schedule_listing_shows_a_token_only_its_queues_schedules(settings: Settings, store: Store) -> None:
    async with clients_with_tokens(settings, store, {"emails": ["queues:emails"], "other": ["queues:other"]}) as clients:
        for who in ("emails", "other"):
            assert (await clients[who].put(f"/v1/periodic/{who}", json={"cron": "0 3 * * *", "queue": who})).status_code == 200
        listed = await clients["emails"].get("/v1/periodic")
        assert listed.status_code == 200 and [s["name"] for s in listed.json()["periodic"]] == ["emails"]


async def test_a_child_may_not_be_created_under_another_queues_item(settings: Settings, store: Store) -> None:
    """Finding 3: a parent_id in a queue the token may not touch is answered as an unknown parent, and nothing
    is created (single and bulk)."""
    async with clients_with_tokens(settings, store, {"emails": ["queues:emails"], "other": ["queues:other"]}) as clients:
        parent = (await clients["other"].post("/v1/queues/other/interactions", json={})).json()
        unknown = await clients["emails"].post("/v1/queues/emails/interactions", json={"parent_id": "987654"})
        for body in ({"parent_id": parent["id"]}, {"parent_id": int(parent["id"])}):
            injected = await clients["emails"].post("/v1/queues/emails/interactions", json=body)
            assert injected.status_code == 404 and injected.json()["code"] == "parent_not_found"
            assert injected.json()["detail"].replace(parent["id"], "987654") == unknown.json()["detail"]
        bulk = await clients["emails"].post("/v1/queues/emails/interactions/bulk",
                                            json={"interactions": [{}, {"parent_id": parent["id"]}]})
        assert bulk.status_code == 404 and bulk.json()["code"] == "parent_not_found"
        assert (await clients["emails"].get("/v1/queues/emails/interactions")).json()["interactions"] == []
        children = await clients["other"].get(f"/v1/interactions/{parent['id']}/children")
        assert children.json()["interactions"] == []
        # A parent in its own queue still works.
        mine = (await clients["emails"].post("/v1/queues/emails/interactions", json={})).json()
        child = await clients["emails"].post("/v1/queues/emails/interactions", json={"parent_id": mine["id"]})
        assert child.status_code == 201 and child.json()["parent_id"] == mine["id"]
