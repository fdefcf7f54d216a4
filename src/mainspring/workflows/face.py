"""Workflows as the server mounts them: the operations of API.md §5 and the loop of ``runner``."""

from __future__ import annotations

from mainspring.core.runtime import Context, Face
from mainspring.workflows.routes import routes
from mainspring.workflows.runner import runner_of


async def run_workflows(ctx: Context) -> None:
    await runner_of(ctx).loop()


face = Face(name="workflows", routes=routes, loops=[run_workflows])
