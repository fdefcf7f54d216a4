"""HTTP routes of the batching face (API.md §4): parse → call the service → answer."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Response
from fastapi.responses import JSONResponse

from mainspring.batching import cafe, service
from mainspring.batching.models import (
    Batcher,
    BatcherSettingsIn,
    ClaimIn,
    CompleteIn,
    FailIn,
    GroupVersions,
    HeartbeatIn,
    Package,
    PackageList,
    Task,
    TaskIn,
    VersionList,
)
from mainspring.core.auth import Principal, authenticate, requires
from mainspring.core.runtime import Context, context_of
from mainspring.core.types import NAME_PATTERN

router = APIRouter(prefix="/v1", tags=["batching"])

NameParam = Path(pattern=NAME_PATTERN)
in_scope = requires("batchers:{name}")


def _authorizer(principal: Principal) -> Any:
    return lambda batcher: principal.require(f"batchers:{batcher}")


@router.put("/batchers/{name}", response_model=Batcher, dependencies=[Depends(in_scope)])
async def put_batcher(body: BatcherSettingsIn, name: str = NameParam, ctx: Context = Depends(context_of)) -> Any:
    """Create a batcher or change its stored settings; every server applies them to the next batch."""
    return await service.put_batcher(ctx.store, name, body)


@router.get("/batchers/{name}", response_model=Batcher, dependencies=[Depends(in_scope)],
            responses={404: {"description": "batcher_not_found"}})
async def get_batcher(name: str = NameParam, ctx: Context = Depends(context_of)) -> Any:
    """A batcher's settings, its batch being formed, and counts of tasks and packages by status."""
    return await service.get_batcher(ctx.store, name)


@router.delete("/batchers/{name}", status_code=204, dependencies=[Depends(in_scope)],
               responses={404: {"description": "batcher_not_found"}, 409: {"description": "batcher_busy"}})
async def delete_batcher(
    name: str = NameParam,
    force: bool = Query(False, description="Delete even while a package of it is claimed under a live lease."),
    ctx: Context = Depends(context_of),
) -> Response:
    """Delete a batcher with its tasks, packages and version log (event ``batch.batcher.removed``).
    409 ``batcher_busy`` while a package of it is claimed and its lease has not expired, unless ``force``."""
    await service.delete_batcher(ctx.store, name, force)
    return Response(status_code=204)


@router.post("/batchers/{name}/tasks", response_model=Task, status_code=202, dependencies=[Depends(in_scope)],
             responses={200: {"model": Task, "description": "a repeat, or rejected as a duplicate"},
                        409: {"description": "task_id_conflict"}})
async def submit_task(body: TaskIn, name: str = NameParam, ctx: Context = Depends(context_of)) -> Any:
    """Submit a task: 202 pending; 200 for a known id, or with status rejected (reason duplicate)."""
    task, accepted = await service.submit_task(ctx.store, name, body, service.registration_defaults(ctx.registry, name))
    return JSONResponse(Task.model_validate(task).model_dump(mode="json"), status_code=202 if accepted else 200)


@router.get("/batchers/{name}/tasks/{task_id}", response_model=Task, dependencies=[Depends(in_scope)],
            responses={404: {"description": "task_not_found"}})
async def get_task(name: str = NameParam, task_id: str = Path(pattern=NAME_PATTERN), ctx: Context = Depends(context_of)) -> Any:
    """Where a task is (status, package) and why (reason, error)."""
    return await service.get_task(ctx.store, name, task_id)


@router.post("/batchers/{name}/packages/claim", response_model=Package, dependencies=[Depends(in_scope)],
             responses={204: {"description": "no package waiting"}})
async def claim_package(body: ClaimIn, name: str = NameParam, ctx: Context = Depends(context_of)) -> Any:
    """Claim the oldest waiting package under a lease, waiting up to ``wait_ms`` for one."""
    wait_ms = int(ctx.wait_s(body.wait_ms or 0) * 1000)
    package = await cafe.claim(ctx.store, name, body.worker, body.lease_ms, wait_ms, ctx.settings.server.poll_interval_ms)
    if package is None:
        return Response(status_code=204)
    return package


@router.get("/batchers/{name}/packages", response_model=PackageList, dependencies=[Depends(in_scope)])
async def list_packages(
    name: str = NameParam,
    status: Literal["ready", "claimed", "done", "failed"] | None = None,
    limit: int = Query(100, ge=1, le=1000),
    cursor: str | None = None,
    ctx: Context = Depends(context_of),
) -> Any:
    """A batcher's packages, oldest first."""
    items, next_cursor = await cafe.list_packages(ctx.store, name, status, limit, cursor)
    return {"packages": items, "next_cursor": next_cursor}


@router.get("/packages/{package_id}", response_model=Package, responses={404: {"description": "package_not_found"}})
async def get_package(
    package_id: str = Path(pattern=NAME_PATTERN),
    principal: Principal = Depends(authenticate),
    ctx: Context = Depends(context_of),
) -> Any:
    """One package with its tasks (never its lease token)."""
    return await cafe.get_package(ctx.store, package_id, _authorizer(principal))


@router.post("/packages/{package_id}/complete", response_model=Package,
             responses={409: {"description": "lease_lost"}, 404: {"description": "package_not_found"}})
async def complete_package(
    body: CompleteIn,
    package_id: str = Path(pattern=NAME_PATTERN),
    principal: Principal = Depends(authenticate),
    ctx: Context = Depends(context_of),
) -> Any:
    """Finish a claimed package; ``results`` gives per-task outcomes (tasks left out are done)."""
    return await cafe.complete_package(ctx.store, package_id, body.token, body.results, _authorizer(principal))


@router.post("/packages/{package_id}/fail", response_model=Package,
             responses={409: {"description": "lease_lost"}, 404: {"description": "package_not_found"}})
async def fail_package(
    body: FailIn,
    package_id: str = Path(pattern=NAME_PATTERN),
    principal: Principal = Depends(authenticate),
    ctx: Context = Depends(context_of),
) -> Any:
    """Give a package up: back to the cafe with ``retry``, else it and its tasks fail."""
    return await cafe.fail_package(ctx.store, package_id, body.token, body.error, body.retry, _authorizer(principal))


@router.post("/packages/{package_id}/heartbeat", response_model=Package,
             responses={409: {"description": "lease_lost"}, 404: {"description": "package_not_found"}})
async def heartbeat_package(
    body: HeartbeatIn,
    package_id: str = Path(pattern=NAME_PATTERN),
    principal: Principal = Depends(authenticate),
    ctx: Context = Depends(context_of),
) -> Any:
    """Extend the lease of a claimed package."""
    return await cafe.heartbeat_package(ctx.store, package_id, body.token, body.lease_ms, _authorizer(principal))


@router.get("/batchers/{name}/versions/{group}/{member}", response_model=VersionList, dependencies=[Depends(in_scope)])
async def list_versions(
    name: str = NameParam,
    group: str = Path(pattern=NAME_PATTERN),
    member: str = Path(pattern=NAME_PATTERN),
    limit: int = Query(1000, ge=1, le=1000),
    cursor: str | None = None,
    ctx: Context = Depends(context_of),
) -> Any:
    """The permanent version log of one group+member, oldest first."""
    items, next_cursor = await service.list_versions(ctx.store, name, group, member, limit, cursor)
    return {"versions": items, "next_cursor": next_cursor}


@router.get("/batchers/{name}/versions/{group}", response_model=GroupVersions, dependencies=[Depends(in_scope)],
            responses={404: {"description": "batcher_not_found"}})
async def group_versions(
    name: str = NameParam, group: str = Path(pattern=NAME_PATTERN), ctx: Context = Depends(context_of)
) -> Any:
    """Every member's version log of one group in one call (both books of a pair, without a scan)."""
    return {"members": await service.group_versions(ctx.store, name, group)}
