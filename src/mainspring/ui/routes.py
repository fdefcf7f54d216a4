"""The dashboard at ``/ui``: pages, actions, login, and the files it ships (htmx, CSS, the tail script)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from mainspring.core.errors import NotFound
from mainspring.ui.actions import actions
from mainspring.ui.pages import pages
from mainspring.ui.web import HERE
from mainspring.web.http import PROBLEM

# Only these files are served: nothing else under the package is reachable, and nothing is fetched
# from the internet by the browser.
STATIC = {
    "htmx.min.js": "text/javascript",
    "ui.css": "text/css",
    "events.js": "text/javascript",
}
_CODES = {404: "not_found", 405: "method_not_allowed"}


async def static_file(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in STATIC:
        return _problem(NotFound(f"no file {name}").problem())
    return FileResponse(HERE / "static" / name, media_type=STATIC[name], headers={"Cache-Control": "public, max-age=3600"})


def _problem(problem: Mapping[str, object], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(problem, status_code=cast(int, problem["status"]), media_type=PROBLEM, headers=headers)


async def _no_route(scope: Scope, receive: Receive, send: Send) -> None:
    """What no page or file answers: a problem, as the API's unknown paths are."""
    path = scope["path"]
    problem = {"type": "https://mainspring.dev/problems/not_found", "title": "Not found", "status": 404,
               "detail": f"nothing at {path}", "code": "not_found"}
    await _problem(problem)(scope, receive, send)


def dashboard() -> Router:
    """The dashboard's routes (and the answer for any other path the API does not serve)."""
    router = Router(routes=[Route("/ui/static/{name}", static_file), *actions.routes, *pages.routes], default=_no_route)
    return router


async def http_error(_request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (a method a page does not take) as problems."""
    assert isinstance(exc, HTTPException)
    code = _CODES.get(exc.status_code, "http_error")
    return _problem({"type": f"https://mainspring.dev/problems/{code}", "title": str(exc.detail), "status": exc.status_code,
                     "detail": str(exc.detail), "code": code}, headers=getattr(exc, "headers", None))
