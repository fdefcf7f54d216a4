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


async def test_docs_and_dashboard_pages_cannot_be_framed_and_run_only_their_own_scripts(client: httpx.AsyncClient) -> None:
    for path in ("/docs", "/ui/login", "/ui/static/ui.css", "/docs/static/swagger-ui.css"):
        page = await client.get(path)
        assert page.status_code == 200, path
        assert page.headers["x-frame-options"] == "DENY" and page.headers["x-content-type-options"] == "nosniff", path
    docs, ui = (await client.get("/docs")).headers, (await client.get("/ui/login")).headers
    for csp in (docs["content-security-policy"], ui["content-security-policy"]):
        assert "frame-ancestors 'none'" in csp and "script-src 'self' " in csp and "'unsafe-inline'" not in csp.split("style-src")[0]


async def test_docs_static_serves_only_the_files_the_page_loads_not_swagger_uis_stock_index(client: httpx.AsyncClient) -> None:
    for path in ("/docs/static/", "/docs/static/index.html", "/docs/static/swagger-initializer.js",
                 "/docs/static/oauth2-redirect.html", "/docs/static/../index.html"):
        answer = await client.get(path)
        assert answer.status_code == 404 and "petstore" not in answer.text, path
