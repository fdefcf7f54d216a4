"""HTTP operations of the batching face (API.md §4): parse → call the service → answer."""

from __future__ import annotations

from mainspring.batching import cafe, service
from mainspring.batching.errors import (
    BatcherBusy,
    BatcherNotFound,
    BatcherSettingsConflict,
    LeaseLost,
    PackageNotFound,
    TaskIdConflict,
    TaskNotFound,
)
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
from mainspring.core.runtime import Context
from mainspring.core.types import Name
from mainspring.web.permissions import Owned, Scope
from mainspring.web.routing import Call, Reply, Routes

routes = Routes("/v1", tag="batching")

BATCHER = Scope("batchers:{name}")


async def _batcher_of(ctx: Context, package_id: str) -> str | None:
    return await cafe.package_batcher(ctx.store, package_id)


# A package of a batcher the token may not use is answered as an unknown package is.
PACKAGE = Owned("package_id", _batcher_of, lambda batcher: f"batchers:{batcher}",
                lambda key: PackageNotFound(f"no package {key!r}"), shown_as="batchers:<the package's batcher>")


@routes.put("/batchers/{name}", permission=BATCHER, problems=[BatcherSettingsConflict])
async def put_batcher(call: Call, name: Name, body: BatcherSettingsIn) -> Batcher:
    """Create a batcher or change its stored settings; every server applies them to the next batch. Fields left
    out keep their stored value; ``409 batcher_settings_conflict`` when the result would have ``min_size`` or
    ``group_size`` over ``max_size``."""
    return Batcher.model_validate(await service.put_batcher(call.store, name, body))


@routes.get("/batchers/{name}", permission=BATCHER, problems=[BatcherNotFound])
async def get_batcher(call: Call, name: Name) -> Batcher:
    """A batcher's settings, its batch being formed, and counts of tasks and packages by status."""
    return Batcher.model_validate(await service.get_batcher(call.store, name))


@routes.delete("/batchers/{name}", permission=BATCHER, status=204, problems=[BatcherNotFound, BatcherBusy])
async def delete_batcher(call: Call, name: Name, query: DeleteBatcherQuery) -> None:
    """Delete a batcher with its tasks, packages and version log (event ``batch.batcher.removed``).
    409 ``batcher_busy`` while a package of it is claimed and its lease has not expired, unless ``force``."""
    await service.delete_batcher(call.store, name, query.force)


@routes.post("/batchers/{name}/tasks", permission=BATCHER, status=202,
             answers={200: "a repeat, or rejected as a duplicate"}, problems=[TaskIdConflict])
async def submit_task(call: Call, name: Name, body: TaskIn) -> Task | Reply:
    """Submit a task: 202 pending; 200 for a known id, or with status rejected (reason duplicate)."""
    task, accepted = await service.submit_task(call.store, name, body, service.registration_defaults(call.ctx.registry, name))
    answer = Task.model_validate(task)
    return answer if accepted else Reply(answer, status=200)


@routes.get("/batchers/{name}/tasks/{task_id}", permission=BATCHER, problems=[TaskNotFound])
async def get_task(call: Call, name: Name, task_id: Name) -> Task:
    """Where a task is (status, package) and why (reason, error)."""
    return Task.model_validate(await service.get_task(call.store, name, task_id))


@routes.post("/batchers/{name}/packages/claim", permission=BATCHER, answers={204: "no package waiting"})
async def claim_package(call: Call, name: Name, body: ClaimIn) -> Package | Reply:
    """Claim the oldest waiting package under a lease, waiting up to ``wait_ms`` for one."""
    wait_ms = int(call.ctx.wait_s(body.wait_ms or 0) * 1000)
    package = await cafe.claim(call.store, name, body.worker, body.lease_ms, wait_ms, call.settings.server.poll_interval_ms)
    return Reply(status=204) if package is None else Package.model_validate(package)


@routes.get("/batchers/{name}/packages", permission=BATCHER)
async def list_packages(call: Call, name: Name, query: PackagesQuery) -> PackageList:
    """A batcher's packages, oldest first."""
    items, next_cursor = await cafe.list_packages(call.store, name, query.status, query.limit, query.cursor)
    return PackageList.model_validate({"packages": items, "next_cursor": next_cursor})


@routes.get("/packages/{package_id}", permission=PACKAGE)
async def get_package(call: Call, package_id: Name) -> Package:
    """One package with its tasks (never its lease token)."""
    return Package.model_validate(await cafe.get_package(call.store, package_id))


@routes.post("/packages/{package_id}/complete", permission=PACKAGE, problems=[LeaseLost])
async def complete_package(call: Call, package_id: Name, body: CompleteIn) -> Package:
    """Finish a claimed package; ``results`` gives per-task outcomes (tasks left out are done)."""
    return Package.model_validate(await cafe.complete_package(call.store, package_id, body.token, body.results))


@routes.post("/packages/{package_id}/fail", permission=PACKAGE, problems=[LeaseLost])
async def fail_package(call: Call, package_id: Name, body: FailIn) -> Package:
    """Give a package up: back to the cafe with ``retry``, else it and its tasks fail."""
    return Package.model_validate(await cafe.fail_package(call.store, package_id, body.token, body.error, body.retry))


@routes.post("/packages/{package_id}/heartbeat", permission=PACKAGE, problems=[LeaseLost])
async def heartbeat_package(call: Call, package_id: Name, body: HeartbeatIn) -> Package:
    """Extend the lease of a claimed package."""
    return Package.model_validate(await cafe.heartbeat_package(call.store, package_id, body.token, body.lease_ms))


@routes.get("/batchers/{name}/versions/{group}/{member}", permission=BATCHER)
async def list_versions(call: Call, name: Name, group: Name, member: Name, query: VersionsQuery) -> VersionList:
    """The permanent version log of one group+member, oldest first."""
    items, next_cursor = await service.list_versions(call.store, name, group, member, query.limit, query.cursor)
    return VersionList.model_validate({"versions": items, "next_cursor": next_cursor})


@routes.get("/batchers/{name}/versions/{group}", permission=BATCHER, problems=[BatcherNotFound])
async def group_versions(call: Call, name: Name, group: Name) -> GroupVersions:
    """Every member's version log of one group in one call (both books of a pair, without a scan)."""
    return GroupVersions.model_validate({"members": await service.group_versions(call.store, name, group)})
