"""Fixtures of the interactions tests: short poll intervals so waits stay short."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from mainspring.api import create_app
from mainspring.config import Settings, load_settings
from mainspring.core import outbox
from mainspring.core.tables import events
from mainspring.store import Store


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 200, "sqlite_synchronous": "NORMAL", "graceful_shutdown_ms": 2000},
        interactions={"expiry_interval_ms": 100, "retention_interval_ms": 100},
    )


async def create(client: httpx.AsyncClient, queue: str = "q", expect: int = 201, **body: Any) -> dict[str, Any]:
    response = await client.post(f"/v1/queues/{queue}/interactions", json=body)
    assert response.status_code == expect, response.text
    return dict(response.json())


async def lease(client: httpx.AsyncClient, queue: str = "q", max: int = 10, **body: Any) -> list[dict[str, Any]]:
    response = await client.post(f"/v1/queues/{queue}/lease", json={"worker": "w1", "max": max, **body})
    assert response.status_code == 200, response.text
    return list(response.json()["interactions"])


async def release(client: httpx.AsyncClient, item: dict[str, Any], outcome: dict[str, Any], expect: int = 200) -> dict[str, Any]:
    response = await client.post(f"/v1/interactions/{item['id']}/release", json={"token": item["lease"]["token"], "outcome": outcome})
    assert response.status_code == expect, response.text
    return dict(response.json())


async def get(client: httpx.AsyncClient, interaction_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/interactions/{interaction_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def put_queue(client: httpx.AsyncClient, queue: str = "q", **body: Any) -> dict[str, Any]:
    response = await client.put(f"/v1/queues/{queue}", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def events_of(client: httpx.AsyncClient, store: Store, types: str = "interaction.*") -> list[dict[str, Any]]:
    """Events so far (on PostgreSQL, numbered now rather than by the sequencer's next round)."""
    for _ in range(200):
        await outbox.assign_positions(store)
        async with store.read() as conn:
            # The background sequencer may hold the numbering lock: wait until it has committed.
            unnumbered = (await conn.execute(select(func.count()).select_from(events).where(events.c.position.is_(None)))).scalar_one()
        if not unnumbered:
            break
        await asyncio.sleep(0.02)
    response = await client.get("/v1/events", params={"types": types, "limit": 1000})
    assert response.status_code == 200, response.text
    return list(response.json()["events"])


@contextlib.asynccontextmanager
async def clients_with_tokens(settings: Settings, store: Store, scopes: dict[str, list[str]]) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """An app whose tokens are the keys of ``scopes`` (each with its scopes), and a client per token; the
    token ``""`` is a client that sends none."""
    data = settings.model_dump()
    data["auth"]["tokens"] = [
        {"token_sha256": hashlib.sha256(token.encode()).hexdigest(), "scopes": given, "name": token} for token, given in scopes.items() if token
    ]
    app = create_app(Settings.model_validate(data), store=store, run_background=False)
    async with app.router.lifespan_context(app), contextlib.AsyncExitStack() as stack:
        transport = httpx.ASGITransport(app=app)
        yield {token: await stack.enter_async_context(httpx.AsyncClient(transport=transport, base_url="http://t", headers={"Authorization": f"Bearer {token}"} if token else {}))
               for token in scopes}
