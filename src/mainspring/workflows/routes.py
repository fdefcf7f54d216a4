"""HTTP operations of workflows (API.md §5)."""

from __future__ import annotations

import uuid
from typing import Any

from mainspring.web.routing import Call, Reply, Routes
from mainspring.workflows import service
from mainspring.workflows.models import (
    ReadQuery,
    Run,
    RunId,
    RunList,
    RunsQuery,
    SignalIn,
    SignalName,
    StartIn,
    WorkflowList,
    WorkflowName,
)

routes = Routes("/v1", tag="workflows", params={"name": WorkflowName, "id": RunId, "signal": SignalName})

SCOPE = "workflows:{name}"
NOT_FOUND = {404: "workflow_not_found / run_not_found"}


@routes.get("/workflows", scope="workflows:*", answer=WorkflowList)
async def list_workflows(call: Call[None]) -> Any:
    """Every workflow registered by this server's app, with its runs counted by status."""
    return {"workflows": await service.workflow_summaries(call.ctx)}


@routes.post("/workflows/{name}/runs", scope=SCOPE, body=StartIn, answer=Run, status=201,
             answers={200: "the existing run with this id, whatever its status"}, problems={404: "workflow_not_found"})
async def start(call: Call[StartIn]) -> Any:
    """Start a run (idempotent by id)."""
    run, created = await service.start_run(call.ctx, call.params["name"], call.body.id or str(uuid.uuid4()), call.body.args)
    return run if created else Reply(run, status=200)


@routes.get("/workflows/{name}/runs", scope=SCOPE, query=RunsQuery, answer=RunList, problems={404: "workflow_not_found"})
async def list_runs(call: Call[None]) -> Any:
    """A workflow's runs (without their steps), by status."""
    query: RunsQuery = call.query
    runs, cursor = await service.list_runs(call.ctx, call.params["name"], query.status, query.limit, query.cursor)
    return {"runs": runs, "cursor": cursor}


@routes.get("/workflows/{name}/runs/{id}", scope=SCOPE, query=ReadQuery, answer=Run, problems=NOT_FOUND)
async def read(call: Call[None]) -> Any:
    """A run with its steps; with ``wait_ms``, once it finishes or the wait ends."""
    query: ReadQuery = call.query
    return await service.get_run(call.ctx, call.params["name"], call.params["id"], query.wait_ms)


@routes.post("/workflows/{name}/runs/{id}/signals/{signal}", scope=SCOPE, body=SignalIn, status=202, answer=dict[str, Any],
             problems={**NOT_FOUND, 409: "run_finished"})
async def signal(call: Call[SignalIn]) -> Any:
    """Send a signal; kept, in order, until a wait takes it."""
    await service.signal_run(call.ctx, call.params["name"], call.params["id"], call.params["signal"], call.body.payload)
    return {}


@routes.post("/workflows/{name}/runs/{id}/cancel", scope=SCOPE, answer=Run, problems={**NOT_FOUND, 409: "run_finished"})
async def cancel(call: Call[None]) -> Any:
    """Cancel a run: its code gets CancelledError at its current await; its tasks and children are cancelled."""
    return await service.cancel_run(call.ctx, call.params["name"], call.params["id"])


@routes.post("/workflows/{name}/runs/{id}/retry", scope=SCOPE, answer=Run, problems={**NOT_FOUND, 409: "run_not_failed"})
async def retry(call: Call[None]) -> Any:
    """Resume a failed run from its records."""
    return await service.retry_run(call.ctx, call.params["name"], call.params["id"])
