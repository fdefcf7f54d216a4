"""The dashboard at ``/ui``: pages, actions, login, and the files it ships (htmx, CSS, the tail script)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException

from mainspring.core.auth import Authenticator
from mainspring.core.errors import MainspringError, NotFound
from mainspring.core.http import PROBLEM
from mainspring.core.runtime import Context
from mainspring.ui import actions, pages
from mainspring.ui.web import HERE

# Only these files are served: nothing else under the package is reachable, and nothing is fetched
# from the internet by the browser.
STATIC = {
    "htmx.min.js": "text/javascript",
    "ui.css": "text/css",
    "events.js": "text/javascript",
}

router = APIRouter(include_in_schema=False)


@router.get("/ui/static/{name}")
async def static_file(name: str) -> Response:
    if name not in STATIC:
        raise NotFound(f"no file {name}")
    return FileResponse(HERE / "static" / name, media_type=STATIC[name], headers={"Cache-Control": "public, max-age=3600"})


router.include_router(actions.router)
router.include_router(pages.router)

_CODES = {404: "not_found", 405: "method_not_allowed"}


def dashboard(ctx: Context, authenticator: Authenticator) -> Any:
    """The dashboard as an ASGI app of its own; whatever path it does not know answers a problem."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.state.context = ctx
    app.state.authenticator = authenticator
    app.include_router(router)

    @app.exception_handler(MainspringError)
    async def _mainspring_error(_request: Request, exc: MainspringError) -> JSONResponse:
        return JSONResponse(exc.problem(), status_code=exc.status, media_type=PROBLEM)

    @app.exception_handler(HTTPException)
    async def _http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        code = _CODES.get(exc.status_code, "http_error")
        problem = {"type": f"https://mainspring.dev/problems/{code}", "title": str(exc.detail), "status": exc.status_code,
                   "detail": str(exc.detail), "code": code}
        return JSONResponse(problem, status_code=exc.status_code, media_type=PROBLEM, headers=getattr(exc, "headers", None))

    return app
