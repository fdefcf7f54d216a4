"""The dashboard at ``/ui``: pages, actions, login, and the files it ships (htmx, CSS, the tail script)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

from mainspring.core.errors import NotFound
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
