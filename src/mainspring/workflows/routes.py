"""HTTP operations of workflows (API.md §5)."""

from __future__ import annotations

import uuid

from mainspring.web.permissions import Scope
from mainspring.web.routing import Call, Reply, Routes
from mainspring.workflows import service
from mainspring.workflows.errors import RunFinished, RunNotFailed, RunNotFound, WorkflowNotFound
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

routes = Routes("/v1", tag="workflows")

SCOPE = Scope("workflows:{name}")
NOT_FOUND = [WorkflowNotFound, RunNotFound]


@routes.get("/workflows", permission=Scope("workflows:*"))
async def list_workflows(call: Call) -> WorkflowList:
    """Every workflow registered by this server's app, with its runs counted by status."""
    return WorkflowList.model_validate({"workflows": await service.workflow_summaries(call.ctx)})


@routes.post("/workflows/{name}/runs", permission=SCOPE, status=201,
             answers={200: "the existing run with this id, whatever its status"}, problems=[WorkflowNotFound])
async def start(call: Call, name: WorkflowName, body: StartIn) -> Run | Reply:
    """Start a run (idempotent by id)."""
    run, created = await service.start_run(call.ctx, name, body.id or str(uuid.uuid4()), body.args)
    answer = Run.model_validate(run)
    return answer if created else Reply(answer, status=200)


@routes.get("/workflows/{name}/runs", permission=SCOPE, problems=[WorkflowNotFound])
async def list_runs(call: Call, name: WorkflowName, query: RunsQuery) -> RunList:
    """A workflow's runs (without their steps), by status."""
    runs, cursor = await service.list_runs(call.ctx, name, query.status, query.limit, query.cursor)
    return RunList.model_validate({"runs": runs, "cursor": cursor})


@routes.get("/workflows/{name}/runs/{id}", permission=SCOPE, problems=NOT_FOUND)
async def read(call: Call, name: WorkflowName, id: RunId, query: ReadQuery) -> Run:
    """A run with its steps; with ``wait_ms``, once it finishes or the wait ends."""
    return Run.model_validate(await service.get_run(call.ctx, name, id, query.wait_ms))


@routes.post("/workflows/{name}/runs/{id}/signals/{signal}", permission=SCOPE, status=202,
             problems=[*NOT_FOUND, RunFinished])
async def signal(call: Call, name: WorkflowName, id: RunId, signal: SignalName, body: SignalIn) -> dict[str, str]:
    """Send a signal; kept, in order, until a wait takes it."""
    await service.signal_run(call.ctx, name, id, signal, body.payload)
    return {}


@routes.post("/workflows/{name}/runs/{id}/cancel", permission=SCOPE, problems=[*NOT_FOUND, RunFinished])
async def cancel(call: Call, name: WorkflowName, id: RunId) -> Run:
    """Cancel a run: its code gets CancelledError at its current await; its tasks and children are cancelled."""
    return Run.model_validate(await service.cancel_run(call.ctx, name, id))


@routes.post("/workflows/{name}/runs/{id}/retry", permission=SCOPE, problems=[*NOT_FOUND, RunNotFailed])
async def retry(call: Call, name: WorkflowName, id: RunId) -> Run:
    """Resume a failed run from its records."""
    return Run.model_validate(await service.retry_run(call.ctx, name, id))
