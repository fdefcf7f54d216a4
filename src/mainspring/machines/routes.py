"""HTTP routes of the machines face (API.md §2)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Response
from fastapi.responses import JSONResponse

from mainspring.core.auth import requires
from mainspring.core.http import PROBLEM
from mainspring.core.runtime import Context, context_of
from mainspring.core.types import Limit
from mainspring.machines import namespaces as ns_service
from mainspring.machines import service
from mainspring.machines.models import (
    CallIn,
    CallOut,
    Machine,
    MachineList,
    NamespaceIn,
    NamespaceOut,
    NotifyIn,
    NotifyOut,
    Operation,
    RepairIn,
    StartIn,
)
from mainspring.machines.settings import HistoryRange, NamespaceConfig

router = APIRouter(prefix="/v1", tags=["machines"])

NAME = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
NsPath = Annotated[str, Path(pattern=NAME)]
IdPath = Annotated[str, Path(pattern=NAME)]
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=200, pattern=r"^[\x21-\x7e]+$")]
Ctx = Annotated[Context, Depends(context_of)]
SCOPE = [Depends(requires("machines:{ns}"))]
ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"description": "namespace_not_found / machine_not_found"},
    409: {"description": "machine_already_exists / machine_failed / machine_already_working"},
    502: {"description": "processor_failed (transient) / processor_refused (permanent)"},
    504: {"description": "processor_timeout"},
}


def _reply(reply: service.Reply) -> JSONResponse:
    media = PROBLEM if reply.status >= 400 else "application/json"
    return JSONResponse(reply.body, status_code=reply.status, media_type=media)


@router.put("/namespaces/{ns}", dependencies=SCOPE, response_model=NamespaceOut)
async def put_namespace(ns: NsPath, body: NamespaceIn, ctx: Ctx) -> Any:
    """Create or change a namespace; every server uses the new settings from its next step, no restart."""
    saved = await ns_service.put_namespace(ctx, ns, NamespaceConfig.model_validate(body.model_dump()))
    return saved.to_api(ctx)


@router.get("/namespaces/{ns}", dependencies=SCOPE, response_model=NamespaceOut, responses={404: ERRORS[404]})
async def get_namespace(ns: NsPath, ctx: Ctx) -> Any:
    return (await ns_service.get_namespace(ctx, ns)).to_api(ctx)


@router.post("/namespaces/{ns}/machines", status_code=201, dependencies=SCOPE, response_model=Machine, responses=ERRORS)
async def start(ns: NsPath, body: StartIn, ctx: Ctx, idempotency_key: IdempotencyKey = None) -> Any:
    """Start a machine: the processor's ``init`` answer becomes its first events, aux state and timer."""
    return _reply(await service.start_machine(ctx, ns, body.id, body.args, idempotency_key))


@router.get("/namespaces/{ns}/machines", dependencies=SCOPE, response_model=MachineList, responses={404: ERRORS[404]})
async def list_machines(
    ns: NsPath,
    ctx: Ctx,
    status: Literal["working", "failed"] | None = None,
    limit: Limit = 100,
    cursor: Annotated[str | None, Query(max_length=1000)] = None,
) -> Any:
    items, next_cursor = await service.list_machines(ctx, ns, status, limit, cursor)
    return {"machines": items, "next_cursor": next_cursor}


@router.get("/namespaces/{ns}/machines/{id}", dependencies=SCOPE, response_model=Machine, responses={404: ERRORS[404]})
async def get_machine(
    ns: NsPath,
    id: IdPath,
    ctx: Ctx,
    after: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    direction: Literal["forward", "backward"] = "forward",
) -> Any:
    """The machine with the requested part of its history and its failure journal."""
    return await service.get_machine(ctx, ns, id, HistoryRange(after=after, limit=limit, direction=direction))


@router.post("/namespaces/{ns}/machines/{id}/call", dependencies=SCOPE, response_model=CallOut, responses=ERRORS)
async def call(ns: NsPath, id: IdPath, body: CallIn, ctx: Ctx, idempotency_key: IdempotencyKey = None) -> Any:
    return _reply(await service.call_machine(ctx, ns, id, body.args, idempotency_key, body.timeout_ms))


@router.post("/namespaces/{ns}/machines/{id}/notifications", status_code=202, dependencies=SCOPE, response_model=NotifyOut, responses={404: ERRORS[404]})
async def notify(ns: NsPath, id: IdPath, body: NotifyIn, ctx: Ctx, idempotency_key: IdempotencyKey = None) -> Any:
    """Queue a notification for the machine; it is delivered later, in order, at least once."""
    return _reply(await service.notify_machine(ctx, ns, id, body.args, idempotency_key))


@router.post("/namespaces/{ns}/machines/{id}/repair", dependencies=SCOPE, response_model=CallOut, responses=ERRORS)
async def repair(ns: NsPath, id: IdPath, body: RepairIn, ctx: Ctx, idempotency_key: IdempotencyKey = None) -> Any:
    return _reply(await service.repair_machine(ctx, ns, id, body.args, idempotency_key, body.simple))


@router.delete("/namespaces/{ns}/machines/{id}", status_code=204, dependencies=SCOPE, responses={404: ERRORS[404]})
async def remove(ns: NsPath, id: IdPath, ctx: Ctx) -> Response:
    await service.remove_machine(ctx, ns, id)
    return Response(status_code=204)


@router.get("/namespaces/{ns}/machines/{id}/operations/{key}", dependencies=SCOPE, response_model=Operation, responses={404: {"description": "operation_not_found"}})
async def operation(ns: NsPath, id: IdPath, key: Annotated[str, Path(max_length=200)], ctx: Ctx) -> Any:
    """Whether and how the operation sent with this Idempotency-Key ended."""
    return await service.get_operation(ctx, ns, id, key)
