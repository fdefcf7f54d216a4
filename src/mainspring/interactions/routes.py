"""HTTP routes of the interactions face (API.md §3): parse → service → model."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response, status

from mainspring.core.auth import Principal, authenticate, requires
from mainspring.core.errors import InvalidRequest
from mainspring.core.runtime import Context, context_of
from mainspring.core.types import DurationMs, Limit, Name
from mainspring.interactions import leasing, periodic, service
from mainspring.interactions.errors import InteractionNotFound
from mainspring.interactions.models import (
    BulkCreateIn,
    ChangeIn,
    CompleteIn,
    CreateIn,
    FailIn,
    HeartbeatIn,
    HeartbeatOut,
    Interaction,
    InteractionList,
    LeaseIn,
    Periodic,
    PeriodicIn,
    PeriodicList,
    QueueOut,
    QueueSettingsIn,
    ReleaseIn,
    RetryIn,
    ScheduleIn,
)
from mainspring.store import format_time

router = APIRouter(prefix="/v1", tags=["interactions"])

QueueName = Annotated[Name, Path(description="The queue.")]
QueueScope = Depends(requires("queues:{queue}"))
ERRORS: dict[int | str, dict[str, Any]] = {404: {"description": "interaction_not_found"}, 409: {"description": "interaction_finished / lease_lost"}}


async def _check_item_scope(ctx: Context, principal: Principal, interaction_id: str) -> dict[str, Any]:
    """Load the item (404 if unknown) and check the caller may touch its queue."""
    item = await service.read(ctx.store, interaction_id)
    principal.require(f"queues:{item['queue']}")
    return item


@router.put("/queues/{queue}", response_model=QueueOut, dependencies=[QueueScope])
async def put_queue(queue: QueueName, body: QueueSettingsIn, ctx: Context = Depends(context_of)) -> Any:
    """Set a queue's limits and timings; every server applies them at its next lease."""
    return await service.put_queue(ctx.store, ctx.settings.interactions, queue, body.model_dump())


@router.get("/queues/{queue}", response_model=QueueOut, dependencies=[QueueScope])
async def get_queue(queue: QueueName, ctx: Context = Depends(context_of)) -> Any:
    """A queue's settings and its interactions counted by status."""
    return await service.get_queue(ctx.store, ctx.settings.interactions, queue)


@router.post("/queues/{queue}/pause", response_model=QueueOut, dependencies=[QueueScope])
async def pause_queue(queue: QueueName, ctx: Context = Depends(context_of)) -> Any:
    """Stop leasing from the queue on every server (items leased already run on); event ``interaction.queue.paused``."""
    return await service.pause_queue(ctx.store, ctx.settings.interactions, queue, True)


@router.post("/queues/{queue}/resume", response_model=QueueOut, dependencies=[QueueScope])
async def resume_queue(queue: QueueName, ctx: Context = Depends(context_of)) -> Any:
    """Lease from a paused queue again; event ``interaction.queue.resumed``."""
    return await service.pause_queue(ctx.store, ctx.settings.interactions, queue, False)


@router.post(
    "/queues/{queue}/interactions",
    response_model=Interaction,
    status_code=status.HTTP_201_CREATED,
    dependencies=[QueueScope],
    responses={200: {"description": "the existing interaction with this message_id"}, 404: {"description": "parent_not_found"}},
)
async def create_interaction(queue: QueueName, body: CreateIn, response: Response, ctx: Context = Depends(context_of)) -> Any:
    """Create an interaction (201), or answer the existing one of this queue with the same `message_id` (200)."""
    item, created = await service.create(ctx.store, ctx.settings.interactions, queue, service.spec_from(body, ctx.now_ms()))
    if not created:
        response.status_code = status.HTTP_200_OK
    return item


@router.post("/queues/{queue}/interactions/bulk", response_model=InteractionList, status_code=201, dependencies=[QueueScope],
             responses={404: {"description": "parent_not_found"}})
async def create_interactions(queue: QueueName, body: BulkCreateIn, ctx: Context = Depends(context_of)) -> Any:
    """Create many interactions in one transaction (all or none), in request order."""
    now = ctx.now_ms()
    results = await service.create_many(ctx.store, ctx.settings.interactions, queue, [service.spec_from(b, now) for b in body.interactions])
    return {"interactions": [item for item, _ in results], "next_cursor": None}


def _statuses(value: str | None) -> list[str] | None:
    if not value:
        return None
    wanted = [s for s in value.split(",") if s]
    bad = [s for s in wanted if s not in service.STATUSES]
    if bad:
        raise InvalidRequest(f"unknown status {bad[0]!r}", errors=[{"loc": ["query", "status"], "msg": f"one of {', '.join(service.STATUSES)}"}])
    return wanted


@router.get("/queues/{queue}/interactions", response_model=InteractionList, dependencies=[QueueScope])
async def list_interactions(
    queue: QueueName,
    ctx: Context = Depends(context_of),
    message_id: Name | None = None,
    status: Annotated[str | None, Query(description="Comma-separated statuses.", max_length=200)] = None,
    channel: Name | None = None,
    user: Name | None = None,
    source: Name | None = None,
    limit: Limit = 100,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Any:
    """A queue's interactions, oldest first."""
    filters = {"message_id": message_id, "channel": channel, "user": user, "source": source, "status": _statuses(status)}
    found, next_cursor = await service.list_items(ctx.store, queue, filters, limit, cursor)
    return {"interactions": found, "next_cursor": next_cursor}


@router.get("/interactions/{interaction_id}", response_model=Interaction, responses=ERRORS)
async def read_interaction(
    interaction_id: str,
    ctx: Context = Depends(context_of),
    principal: Principal = Depends(authenticate),
    wait_ms: DurationMs = 0,
) -> Any:
    """An interaction; with `wait_ms`, answers as soon as it is finished (or when the wait is over)."""
    item = await _check_item_scope(ctx, principal, interaction_id)
    if wait_ms and item["status"] not in service.FINISHED:
        item = await service.wait_finished(ctx.store, interaction_id, int(ctx.wait_s(wait_ms) * 1000))
    return item


@router.get("/interactions/{interaction_id}/children", response_model=InteractionList, responses=ERRORS)
async def list_children(
    interaction_id: str,
    ctx: Context = Depends(context_of),
    principal: Principal = Depends(authenticate),
    name: Name | None = None,
    limit: Limit = 100,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Any:
    """Children of an interaction (with `name`), oldest first."""
    await _check_item_scope(ctx, principal, interaction_id)
    found, next_cursor = await service.children(ctx.store, interaction_id, name, limit, cursor)
    return {"interactions": found, "next_cursor": next_cursor}


@router.get("/interactions/{interaction_id}/children/latest", response_model=Interaction, responses=ERRORS)
async def latest_child(
    interaction_id: str, ctx: Context = Depends(context_of), principal: Principal = Depends(authenticate), name: Name | None = None
) -> Any:
    """The most recently created child (with `name`)."""
    await _check_item_scope(ctx, principal, interaction_id)
    return await service.latest_child(ctx.store, interaction_id, name)


@router.post("/interactions/{interaction_id}/complete", response_model=Interaction, responses=ERRORS)
async def complete(
    interaction_id: str, body: CompleteIn | None = None, ctx: Context = Depends(context_of), principal: Principal = Depends(authenticate)
) -> Any:
    """Finish as completed with `result`."""
    await _check_item_scope(ctx, principal, interaction_id)
    return await service.complete(ctx.store, interaction_id, body.result if body else None)


@router.post("/interactions/{interaction_id}/fail", response_model=Interaction, responses=ERRORS)
async def fail(interaction_id: str, body: FailIn, ctx: Context = Depends(context_of), principal: Principal = Depends(authenticate)) -> Any:
    """Finish as failed with `error`."""
    await _check_item_scope(ctx, principal, interaction_id)
    return await service.fail(ctx.store, interaction_id, body.error)


@router.post("/interactions/{interaction_id}/cancel", response_model=Interaction, responses=ERRORS)
async def cancel(interaction_id: str, ctx: Context = Depends(context_of), principal: Principal = Depends(authenticate)) -> Any:
    """Cancel; a worker processing it loses its lease and its handler is cancelled."""
    await _check_item_scope(ctx, principal, interaction_id)
    return await service.cancel(ctx.store, interaction_id)


@router.post("/interactions/{interaction_id}/schedule", response_model=Interaction, responses=ERRORS)
async def schedule(interaction_id: str, body: ScheduleIn, ctx: Context = Depends(context_of), principal: Principal = Depends(authenticate)) -> Any:
    """Process at `process_at`, or `process_in_ms` from now."""
    await _check_item_scope(ctx, principal, interaction_id)
    due = body.due_at(ctx.now_ms())
    assert due is not None
    return await service.schedule(ctx.store, interaction_id, due)


@router.post("/interactions/{interaction_id}/retry", response_model=Interaction,
             responses={404: {"description": "interaction_not_found"},
                        409: {"description": "interaction_not_finished / interaction_finished (completed)"}})
async def retry(
    interaction_id: str, body: RetryIn | None = None, ctx: Context = Depends(context_of), principal: Principal = Depends(authenticate)
) -> Any:
    """Run a failed or cancelled interaction again (attempts back to 0), now or `process_in_ms` from now."""
    await _check_item_scope(ctx, principal, interaction_id)
    due = None if body is None or body.process_in_ms is None else ctx.now_ms() + body.process_in_ms
    return await service.retry(ctx.store, interaction_id, due)


@router.patch("/interactions/{interaction_id}", response_model=Interaction, responses=ERRORS)
async def change_data(interaction_id: str, body: ChangeIn, ctx: Context = Depends(context_of), principal: Principal = Depends(authenticate)) -> Any:
    """Replace an unfinished interaction's `data` (event `interaction.changed` with the new data)."""
    await _check_item_scope(ctx, principal, interaction_id)
    return await service.change_data(ctx.store, interaction_id, body.data)


@router.put("/periodic/{name}", response_model=Periodic, responses={422: {"description": "invalid cron expression or time zone"}})
async def put_periodic(
    body: PeriodicIn, name: Name = Path(description="The schedule."), ctx: Context = Depends(context_of),
    principal: Principal = Depends(authenticate),
) -> Any:
    """Create or replace a cron schedule that creates one interaction in `queue` per tick, exactly once
    across all servers (the tick is its idempotency key)."""
    principal.require(f"queues:{body.queue}")
    return await periodic.put_schedule(ctx.store, name, cron=body.cron, queue=body.queue, data_=body.data, timezone=body.timezone,
                                       catch_up_ms=body.catch_up_ms)


@router.get("/periodic", response_model=PeriodicList)
async def list_periodic(ctx: Context = Depends(context_of), principal: Principal = Depends(authenticate)) -> Any:
    """Every schedule whose queue the caller may see."""
    found = [s for s in await periodic.list_schedules(ctx.store) if principal.allows(f"queues:{s['queue']}")]
    return {"periodic": found, "next_cursor": None}


@router.get("/periodic/{name}", response_model=Periodic, responses={404: {"description": "periodic_not_found"}})
async def get_periodic(name: Name = Path(), ctx: Context = Depends(context_of), principal: Principal = Depends(authenticate)) -> Any:
    """One schedule, with its next tick."""
    found = await periodic.get_schedule(ctx.store, name)
    principal.require(f"queues:{found['queue']}")
    return found


@router.delete("/periodic/{name}", status_code=204, responses={404: {"description": "periodic_not_found"}})
async def delete_periodic(name: Name = Path(), ctx: Context = Depends(context_of), principal: Principal = Depends(authenticate)) -> Response:
    """Stop a schedule (interactions it created stay)."""
    found = await periodic.get_schedule(ctx.store, name)
    principal.require(f"queues:{found['queue']}")
    await periodic.delete_schedule(ctx.store, name)
    return Response(status_code=204)


@router.post("/queues/{queue}/lease", response_model=InteractionList, dependencies=[QueueScope])
async def lease(queue: QueueName, body: LeaseIn, ctx: Context = Depends(context_of)) -> Any:
    """Lease up to `max` due interactions within the queue's limits; `wait_ms` long-polls."""
    cfg = ctx.settings.interactions
    wait_ms = int(ctx.wait_s(body.wait_ms) * 1000)
    taken = await leasing.lease_wait(ctx.store, cfg, queue, body.worker, body.max, body.lease_ms, wait_ms, ctx.settings.server.poll_interval_ms)
    return {"interactions": taken.items, "next_cursor": None}


@router.post("/interactions/{interaction_id}/heartbeat", response_model=HeartbeatOut, responses=ERRORS)
async def heartbeat(interaction_id: str, body: HeartbeatIn, ctx: Context = Depends(context_of), principal: Principal = Depends(authenticate)) -> Any:
    """Extend a held lease."""
    if not principal.open:
        await _check_item_scope(ctx, principal, interaction_id)
    expires = await leasing.heartbeat(ctx.store, interaction_id, body.token, body.lease_ms)
    return {"expires_at": format_time(expires)}


@router.post("/interactions/{interaction_id}/release", response_model=Interaction, responses=ERRORS)
async def release(interaction_id: str, body: ReleaseIn, ctx: Context = Depends(context_of), principal: Principal = Depends(authenticate)) -> Any:
    """End a held lease with an outcome: complete, fail, repeat, wait or retry."""
    if not principal.open:
        await _check_item_scope(ctx, principal, interaction_id)
    return await leasing.release(ctx.store, interaction_id, body.token, body.outcome.to_outcome())


__all__ = ["InteractionNotFound", "router"]
