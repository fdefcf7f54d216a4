"""HTTP operations of the batching face (API.md §4): parse → call the service → answer."""

from __future__ import annotations

from typing import Any

from mainspring.batching import cafe, service
from mainspring.batching.models import (
    Batcher,
    BatcherSettingsIn,
    ClaimIn,
    CompleteIn,
    DeleteBatcherQuery,
    FailIn,
    GroupVersions,
    HeartbeatIn,
    Package,
    PackageList,
    PackagesQuery,
    Task,
    TaskIn,
    VersionList,
    VersionsQuery,
)
from mainspring.core.auth import Principal
from mainspring.core.types import Name
from mainspring.web.routing import Call, Reply, Routes

routes = Routes("/v1", tag="batching",
                params={"name": Name, "task_id": Name, "package_id": Name, "group": Name, "member": Name})

BATCHER = "batchers:{name}"
PACKAGE_PROBLEMS = {404: "package_not_found", 409: "lease_lost"}


def _authorizer(principal: Principal) -> Any:
    return lambda batcher: principal.require(f"batchers:{batcher}")


@routes.put("/batchers/{name}", scope=BATCHER, body=BatcherSettingsIn, answer=Batcher)
async def put_batcher(call: Call[BatcherSettingsIn]) -> Any:
    """Create a batcher or change its stored settings; every server applies them to the next batch."""
    return await service.put_batcher(call.store, call.params["name"], call.body)


@routes.get("/batchers/{name}", scope=BATCHER, answer=Batcher, problems={404: "batcher_not_found"})
async def get_batcher(call: Call[None]) -> Any:
    """A batcher's settings, its batch being formed, and counts of tasks and packages by status."""
    return await service.get_batcher(call.store, call.params["name"])


@routes.delete("/batchers/{name}", scope=BATCHER, query=DeleteBatcherQuery, status=204,
               problems={404: "batcher_not_found", 409: "batcher_busy"})
async def delete_batcher(call: Call[None]) -> Any:
    """Delete a batcher with its tasks, packages and version log (event ``batch.batcher.removed``).
    409 ``batcher_busy`` while a package of it is claimed and its lease has not expired, unless ``force``."""
    await service.delete_batcher(call.store, call.params["name"], call.query.force)


@routes.post("/batchers/{name}/tasks", scope=BATCHER, body=TaskIn, answer=Task, status=202,
             answers={200: "a repeat, or rejected as a duplicate"}, problems={409: "task_id_conflict"})
async def submit_task(call: Call[TaskIn]) -> Any:
    """Submit a task: 202 pending; 200 for a known id, or with status rejected (reason duplicate)."""
    name = call.params["name"]
    task, accepted = await service.submit_task(call.store, name, call.body, service.registration_defaults(call.ctx.registry, name))
    return task if accepted else Reply(task, status=200)


@routes.get("/batchers/{name}/tasks/{task_id}", scope=BATCHER, answer=Task, problems={404: "task_not_found"})
async def get_task(call: Call[None]) -> Any:
    """Where a task is (status, package) and why (reason, error)."""
    return await service.get_task(call.store, call.params["name"], call.params["task_id"])


@routes.post("/batchers/{name}/packages/claim", scope=BATCHER, body=ClaimIn, answer=Package, answers={204: "no package waiting"})
async def claim_package(call: Call[ClaimIn]) -> Any:
    """Claim the oldest waiting package under a lease, waiting up to ``wait_ms`` for one."""
    body = call.body
    wait_ms = int(call.ctx.wait_s(body.wait_ms or 0) * 1000)
    package = await cafe.claim(call.store, call.params["name"], body.worker, body.lease_ms, wait_ms,
                               call.settings.server.poll_interval_ms)
    return Reply(status=204) if package is None else package


@routes.get("/batchers/{name}/packages", scope=BATCHER, query=PackagesQuery, answer=PackageList)
async def list_packages(call: Call[None]) -> Any:
    """A batcher's packages, oldest first."""
    query: PackagesQuery = call.query
    items, next_cursor = await cafe.list_packages(call.store, call.params["name"], query.status, query.limit, query.cursor)
    return {"packages": items, "next_cursor": next_cursor}


@routes.get("/packages/{package_id}", answer=Package, problems={404: "package_not_found"})
async def get_package(call: Call[None]) -> Any:
    """One package with its tasks (never its lease token)."""
    return await cafe.get_package(call.store, call.params["package_id"], _authorizer(call.principal))


@routes.post("/packages/{package_id}/complete", body=CompleteIn, answer=Package, problems=PACKAGE_PROBLEMS)
async def complete_package(call: Call[CompleteIn]) -> Any:
    """Finish a claimed package; ``results`` gives per-task outcomes (tasks left out are done)."""
    return await cafe.complete_package(call.store, call.params["package_id"], call.body.token, call.body.results,
                                       _authorizer(call.principal))


@routes.post("/packages/{package_id}/fail", body=FailIn, answer=Package, problems=PACKAGE_PROBLEMS)
async def fail_package(call: Call[FailIn]) -> Any:
    """Give a package up: back to the cafe with ``retry``, else it and its tasks fail."""
    body = call.body
    return await cafe.fail_package(call.store, call.params["package_id"], body.token, body.error, body.retry,
                                   _authorizer(call.principal))


@routes.post("/packages/{package_id}/heartbeat", body=HeartbeatIn, answer=Package, problems=PACKAGE_PROBLEMS)
async def heartbeat_package(call: Call[HeartbeatIn]) -> Any:
    """Extend the lease of a claimed package."""
    return await cafe.heartbeat_package(call.store, call.params["package_id"], call.body.token, call.body.lease_ms,
                                        _authorizer(call.principal))


@routes.get("/batchers/{name}/versions/{group}/{member}", scope=BATCHER, query=VersionsQuery, answer=VersionList)
async def list_versions(call: Call[None]) -> Any:
    """The permanent version log of one group+member, oldest first."""
    query: VersionsQuery = call.query
    items, next_cursor = await service.list_versions(call.store, call.params["name"], call.params["group"],
                                                     call.params["member"], query.limit, query.cursor)
    return {"versions": items, "next_cursor": next_cursor}


@routes.get("/batchers/{name}/versions/{group}", scope=BATCHER, answer=GroupVersions, problems={404: "batcher_not_found"})
async def group_versions(call: Call[None]) -> Any:
    """Every member's version log of one group in one call (both books of a pair, without a scan)."""
    return {"members": await service.group_versions(call.store, call.params["name"], call.params["group"])}
