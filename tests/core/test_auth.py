"""Bearer tokens and scopes, as API.md says."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from mainspring.api import create_app
from mainspring.config import Settings, load_settings
from mainspring.core.auth import create_token, hash_token, revoke_token, scope_allows
from mainspring.store import Store


@pytest.fixture
def settings(database_url: str, tmp_path: Any) -> Settings:
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 200},
        auth={"tokens": [{"token_sha256": hash_token("config-admin"), "scopes": ["admin"], "name": "ops"}], "cache_ms": 0},
    )


@pytest.fixture
async def client(settings: Settings, store: Store) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, store=store)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_no_token_is_401_unauthenticated(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/events")
    assert response.status_code == 401
    assert response.json()["code"] == "unauthenticated"


async def test_unknown_token_is_401(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/events", headers=bearer("nope"))
    assert response.status_code == 401


async def test_wrong_scope_is_403_forbidden(client: httpx.AsyncClient, store: Store) -> None:
    _, token = await create_token(store, "worker", ["queues:emails"])
    response = await client.get("/v1/events", headers=bearer(token))
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"


async def test_right_scope_is_200(client: httpx.AsyncClient, store: Store) -> None:
    _, token = await create_token(store, "viewer", ["ui"])
    assert (await client.get("/v1/events", headers=bearer(token))).status_code == 200
    assert (await client.get("/v1/events", headers=bearer("config-admin"))).status_code == 200


async def test_revoked_token_is_refused(client: httpx.AsyncClient, store: Store) -> None:
    token_id, token = await create_token(store, "temp", ["admin"])
    assert (await client.get("/v1/events", headers=bearer(token))).status_code == 200
    await revoke_token(store, token_id)
    assert (await client.get("/v1/events", headers=bearer(token))).status_code == 401


async def test_service_endpoints_are_never_behind_auth(client: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
        assert (await client.get(path)).status_code == 200, path


def test_scope_wildcards_match_only_at_the_end() -> None:
    assert scope_allows("admin", "queues:emails")
    assert scope_allows("queues:*", "queues:emails")
    assert scope_allows("exchange:send:*", "exchange:send:shop-1")
    assert not scope_allows("exchange:send:*", "exchange:receive:shop-1")
    assert not scope_allows("queues:email", "queues:emails")
    assert not scope_allows("queues:emails", "queues:email")


def open_settings(database_url: str, tmp_path: Any, **auth: Any) -> Settings:
    return load_settings(None, server={"database": database_url, "data_dir": tmp_path / "data"}, auth={"cache_ms": 0, **auth})


async def test_revoking_the_last_stored_token_leaves_the_server_closed_and_says_so(
        database_url: str, tmp_path: Any, store: Store, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(open_settings(database_url, tmp_path), store=store, run_background=False)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.get("/v1/alerts")).status_code == 200
        assert "the server is OPEN" in caplog.text
        token_id, token = await create_token(store, "ops", ["admin"])
        assert (await client.get("/v1/alerts")).status_code == 401
        assert "the server is now CLOSED" in caplog.text
        await revoke_token(store, token_id)
        assert (await client.get("/v1/alerts")).status_code == 401
        assert (await client.post("/v1/queues/victim/pause", headers=bearer("garbage"))).status_code == 401
        assert (await client.get("/v1/alerts", headers=bearer(token))).status_code == 401
        assert "every stored token is revoked: the server is CLOSED" in caplog.text


async def test_a_server_whose_tokens_were_all_revoked_opens_only_when_configured_to(
        database_url: str, tmp_path: Any, store: Store, caplog: pytest.LogCaptureFixture) -> None:
    token_id, _ = await create_token(store, "ops", ["admin"])
    await revoke_token(store, token_id)
    app = create_app(open_settings(database_url, tmp_path, open_when_all_revoked=True), store=store, run_background=False)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.get("/v1/alerts")).status_code == 200
    assert "every stored token is revoked and auth.open_when_all_revoked is set" in caplog.text
