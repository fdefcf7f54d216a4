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
            assert answer.status_code == 403 and answer.json()["code"] == "forbidden"
        leased = (await admin.post("/v1/queues/beta/lease", json={"worker": "w", "max": 1})).json()["interactions"]
        steal = await a.post(f"/v1/interactions/{theirs['id']}/release", json={"token": leased[0]["lease"]["token"], "outcome": {"complete": {}}})
        assert steal.status_code == 403
        assert (await a.get(f"/v1/interactions/{mine.json()['id']}")).status_code == 200
        assert (await anonymous.get("/v1/queues/alpha")).status_code == 401
