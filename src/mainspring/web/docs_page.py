"""``/docs``: Swagger UI over the server's OpenAPI document, its scripts and styles served by the server
itself; and ``/``, which sends people to the dashboard and the docs.

The browser fetches nothing from elsewhere (an operator's machine may reach only the server). Swagger UI
comes from the ``swagger-ui-bundle-v2`` package, which tracks Swagger UI 5 (the first to render OpenAPI
3.1). These are plain Starlette routes, so any ASGI app can serve them:

```python
from starlette.applications import Starlette
from mainspring.web.docs_page import docs_routes

app = Starlette(routes=[*docs_routes(openapi_url="/openapi.json"), *root_routes()])
```
"""

from __future__ import annotations

import html
import json

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

DOCS_PATH = "/docs"

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<link rel="stylesheet" href="{static}/swagger-ui.css">
<link rel="icon" type="image/png" href="{static}/favicon-32x32.png" sizes="32x32">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{static}/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({{
  url: {openapi_url},
  dom_id: "#swagger-ui",
  deepLinking: true,
  persistAuthorization: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout"
}});
</script>
</body>
</html>
"""


def docs_page(openapi_url: str, *, title: str = "Mainspring API", static_path: str = f"{DOCS_PATH}/static") -> str:
    """The HTML of the docs page: Swagger UI reading ``openapi_url``, its files under ``static_path``."""
    # validatorUrl null: Swagger UI would otherwise send the document to an online validator.
    return _PAGE.format(title=html.escape(title), static=html.escape(static_path), openapi_url=json.dumps(openapi_url))


def docs_routes(openapi_url: str = "/openapi.json", *, path: str = DOCS_PATH, title: str = "Mainspring API") -> list[BaseRoute]:
    """The page at ``path`` and Swagger UI's files under ``path/static``."""
    static_path = f"{path}/static"
    page = docs_page(openapi_url, title=title, static_path=static_path)

    async def show(_request: Request) -> HTMLResponse:
        return HTMLResponse(page)

    return [
        Route(path, show, methods=["GET", "HEAD"], name="docs"),
        Mount(static_path, StaticFiles(directory=swagger_ui_path), name="docs-static"),
    ]


def root_routes(*, ui: str = "/ui/", docs: str = DOCS_PATH, openapi_url: str = "/openapi.json", api: str = "/v1",
                **about: str) -> list[BaseRoute]:
    """``GET /``: a browser is sent to the dashboard (which links to the docs); anyone else gets where the
    dashboard, the docs, the OpenAPI document and the API are (with ``about``, such as the version)."""
    places = {"name": "Mainspring", **about, "ui": ui, "docs": docs, "openapi": openapi_url, "api": api}

    async def root(request: Request) -> Response:
        if "text/html" in request.headers.get("accept", ""):
            return RedirectResponse(ui, status_code=307)
        return JSONResponse(places)

    return [Route("/", root, methods=["GET", "HEAD"], name="root")]
