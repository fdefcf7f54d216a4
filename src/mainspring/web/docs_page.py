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

import base64
import hashlib
import html
import json
import re
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route
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


# Only what the page loads: the package also holds Swagger UI's stock index.html, whose initializer loads the
# remote petstore document, and an OAuth redirect page — neither is this server's to serve.
STATIC = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "text/javascript",
    "favicon-32x32.png": "image/png",
}


def content_security_policy(page: str, *, extra_script_hashes: tuple[str, ...] = ()) -> str:
    """A CSP for one of this server's pages: everything from the server itself, the page's inline scripts by
    their hashes, never framed (clickjacking), no base or form target elsewhere."""
    inline = [f"'sha256-{base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()}'"
              for code in re.findall(r"<script>(.*?)</script>", page, flags=re.DOTALL)]
    hashes = " ".join([*inline, *extra_script_hashes])
    unsafe_hashes = "'unsafe-hashes' " if extra_script_hashes else ""
    return (f"default-src 'self'; script-src 'self' {unsafe_hashes}{hashes}; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'")


PAGE_HEADERS = {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}


def docs_routes(openapi_url: str = "/openapi.json", *, path: str = DOCS_PATH, title: str = "Mainspring API") -> list[BaseRoute]:
    """The page at ``path`` and Swagger UI's files under ``path/static``."""
    static_path = f"{path}/static"
    page = docs_page(openapi_url, title=title, static_path=static_path)
    headers = {**PAGE_HEADERS, "Content-Security-Policy": content_security_policy(page)}
    files = Path(swagger_ui_path)

    async def show(_request: Request) -> HTMLResponse:
        return HTMLResponse(page, headers=headers)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return JSONResponse({"type": "https://mainspring.dev/problems/not_found", "title": "Not found", "status": 404,
                                 "detail": f"no file {name}", "code": "not_found"}, status_code=404,
                                media_type="application/problem+json")
        return FileResponse(files / name, media_type=STATIC[name],
                            headers={**PAGE_HEADERS, "Cache-Control": "public, max-age=3600"})

    return [
        Route(path, show, methods=["GET", "HEAD"], name="docs"),
        Route(f"{static_path}/{{name:path}}", static, methods=["GET", "HEAD"], name="docs-static"),
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
