"""Workflows as the server mounts them: the operations of API.md §5 and the loop of ``runner``."""

from __future__ import annotations

from mainspring.core.runtime import Context
from mainspring.face import Face
from mainspring.workflows.cli import cli
from mainspring.workflows.routes import routes
from mainspring.workflows.runner import runner_of
from mainspring.workflows.service import store_namespaces


async def run_workflows(ctx: Context) -> None:
    await runner_of(ctx).loop()


face = Face(name="workflows", routes=routes, recover=store_namespaces, loops=[run_workflows], cli=cli)
