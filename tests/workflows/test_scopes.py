"""Scopes: ``workflows:<name>`` (or ``workflows:*``) grants a workflow's runs."""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

import httpx

from mainspring.api import create_app
from mainspring.app import App
from mainspring.config import Settings
from mainspring.store import Store


async def test_a_token_reaches_only_the_workflows_its_scopes_name(settings: Settings, store: Store) -> None:
    registry = App()

    @registry.workflow("orders")
    async def orders(wf: Any, args: Any) -> None:
        return None

    @registry.workflow("refunds")
    async def refunds(wf: Any, args: Any) -> None:
        return None

    scopes = {"orders-only": ["workflows:orders"], "all": ["workflows:*"]}
    data = settings.model_dump()
    data["auth"]["tokens"] = [{"token_sha256": hashlib.sha256(t.encode()).hexdigest(), "scopes": s, "name": t} for t, s in scopes.items()]
    app = create_app(Settings.model_validate(data), store=store, registry=registry)
    async with app.router.lifespan_context(app), contextlib.AsyncExitStack() as stack:
        transport = httpx.ASGITransport(app=app)
        clients = {t: await stack.enter_async_context(httpx.AsyncClient(transport=transport, base_url="http://t", headers={"Authorization": f"Bearer {t}"}))
                   for t in scopes}
        mine, every = clients["orders-only"], clients["all"]
        assert (await mine.post("/v1/workflows/orders/runs", json={"id": "1"})).status_code == 201
        for refused in (mine.post("/v1/workflows/refunds/runs", json={}), mine.get("/v1/workflows/refunds/runs"), mine.get("/v1/workflows")):
            answer = await refused
            assert answer.status_code == 403 and answer.json()["code"] == "forbidden"
        assert (await every.post("/v1/workflows/refunds/runs", json={"id": "1"})).status_code == 201
        assert [w["name"] for w in (await every.get("/v1/workflows")).json()["workflows"]] == ["orders", "refunds"]
