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
