"""Scopes: a token sees only the queues its `queues:<queue>` scopes name."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx

from mainspring.api import create_app
from mainspring.config import Settings
from mainspring.store import Store


async def test_queue_scopes_limit_what_a_token_touches(settings: Settings, store: Store) -> None:
    data = settings.model_dump()
    data["auth"]["tokens"] = [
        {"token_sha256": hashlib.sha256(b"tok-a").hexdigest(), "scopes": ["queues:a*"], "name": "a"},
        {"token_sha256": hashlib.sha256(b"tok-admin").hexdigest(), "scopes": ["admin"], "name": "admin"},
    ]
    app = create_app(Settings.model_validate(data), store=store, run_background=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers={"Authorization": "Bearer tok-a"}) as a, httpx.AsyncClient(
            transport=transport, base_url="http://t", headers={"Authorization": "Bearer tok-admin"}
        ) as admin:
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
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as anonymous:
                assert (await anonymous.get("/v1/queues/alpha")).status_code == 401
