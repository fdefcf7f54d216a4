"""``/docs`` is Swagger UI served from the package: a browser without internet access gets a working page."""

from __future__ import annotations

import re

import httpx


async def test_docs_serves_swagger_ui_from_this_server_not_a_cdn(client: httpx.AsyncClient) -> None:
    page = await client.get("/docs")
    assert page.status_code == 200 and "/openapi.json" in page.text
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert assets and all(a.startswith("/docs/static/") for a in assets), assets
    for asset in assets:
        reply = await client.get(asset)
        assert reply.status_code == 200 and len(reply.content) > 100, asset
    assert "cdn" not in page.text.lower()
    assert (await client.get("/redoc")).status_code == 404


async def test_the_root_sends_a_browser_to_the_dashboard_and_names_the_docs_to_anyone_else(client: httpx.AsyncClient) -> None:
    browser = await client.get("/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert browser.status_code in (302, 303, 307) and browser.headers["location"] == "/ui/"
    other = await client.get("/")
    assert other.status_code == 200
    assert {"ui": "/ui/", "docs": "/docs", "openapi": "/openapi.json", "api": "/v1"}.items() <= other.json().items()
