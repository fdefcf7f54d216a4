"""HTTP operations of the interactions face (API.md §3): parse → service → answer."""

from __future__ import annotations

from typing import Any

from mainspring.core.auth import Principal
from mainspring.core.errors import InvalidRequest
from mainspring.core.runtime import Context
from mainspring.core.types import Name
from mainspring.interactions import leasing, periodic, service
from mainspring.interactions.errors import InteractionNotFound
from mainspring.interactions.models import (
    BulkCreateIn,
    ChangeIn,
    ChildrenQuery,
    CompleteIn,
    CreateIn,
    FailIn,
    HeartbeatIn,
    HeartbeatManyIn,
    HeartbeatManyOut,
    HeartbeatOut,
    Interaction,
    InteractionList,
    LatestChildQuery,
    LeaseIn,
    ListQuery,
    Periodic,
    PeriodicIn,
    PeriodicList,
    QueueOut,
    QueueSettingsIn,
    ReadQuery,
    ReleaseIn,
    ReleaseManyIn,
    ReleaseManyOut,
    RetryIn,
    ScheduleIn,
)
from mainspring.store import format_time
from mainspring.web.routing import Call, Reply, Routes

routes = Routes("/v1", tag="interactions", params={"queue": Name, "name": Name})

QUEUE = "queues:{queue}"
ITEM_PROBLEMS = {404: "interaction_not_found", 409: "interaction_finished / lease_lost"}


async def _check_item_scope(ctx: Context, principal: Principal, interaction_id: str) -> dict[str, Any]:
    """Load the item (404 if unknown) and check the caller may touch its queue."""
    item = await service.read(ctx.store, interaction_id)
    principal.require(f"queues:{item['queue']}")
    return item


@routes.put("/queues/{queue}", scope=QUEUE, body=QueueSettingsIn, answer=QueueOut)
async def put_queue(call: Call[QueueSettingsIn]) -> Any:
    """Set a queue's limits and timings; every server applies them at its next lease."""
    return await service.put_queue(call.store, call.settings.interactions, call.params["queue"], call.body.model_dump())


@routes.get("/queues/{queue}", scope=QUEUE, answer=QueueOut)
async def get_queue(call: Call[None]) -> Any:
    """A queue's settings and its interactions counted by status."""
    return await service.get_queue(call.store, call.settings.interactions, call.params["queue"])


@routes.post("/queues/{queue}/pause", scope=QUEUE, answer=QueueOut)
async def pause_queue(call: Call[None]) -> Any:
    """Stop leasing from the queue on every server (items leased already run on); event ``interaction.queue.paused``."""
    return await service.pause_queue(call.store, call.settings.interactions, call.params["queue"], True)


@routes.post("/queues/{queue}/resume", scope=QUEUE, answer=QueueOut)
async def resume_queue(call: Call[None]) -> Any:
    """Lease from a paused queue again; event ``interaction.queue.resumed``."""
    return await service.pause_queue(call.store, call.settings.interactions, call.params["queue"], False)


@routes.post("/queues/{queue}/interactions", scope=QUEUE, body=CreateIn, answer=Interaction, status=201,
             answers={200: "the existing interaction with this message_id"}, problems={404: "parent_not_found"})
async def create_interaction(call: Call[CreateIn]) -> Any:
    """Create an interaction (201), or answer the existing one of this queue with the same `message_id` (200)."""
    item, created = await service.create(call.store, call.settings.interactions, call.params["queue"],
                                         service.spec_from(call.body, call.now_ms()))
    return item if created else Reply(item, status=200)


@routes.post("/queues/{queue}/interactions/bulk", scope=QUEUE, body=BulkCreateIn, answer=InteractionList, status=201,
             problems={404: "parent_not_found"})
async def create_interactions(call: Call[BulkCreateIn]) -> Any:
    """Create many interactions in one transaction (all or none), in request order."""
    now = call.now_ms()
    results = await service.create_many(call.store, call.settings.interactions, call.params["queue"],
                                        [service.spec_from(b, now) for b in call.body.interactions])
    return {"interactions": [item for item, _ in results], "next_cursor": None}


def _statuses(value: str | None) -> list[str] | None:
    if not value:
        return None
    wanted = [s for s in value.split(",") if s]
    bad = [s for s in wanted if s not in service.STATUSES]
    if bad:
        raise InvalidRequest(f"unknown status {bad[0]!r}", errors=[{"loc": ["query", "status"], "msg": f"one of {', '.join(service.STATUSES)}"}])
    return wanted


@routes.get("/queues/{queue}/interactions", scope=QUEUE, query=ListQuery, answer=InteractionList)
async def list_interactions(call: Call[None]) -> Any:
    """A queue's interactions, oldest first."""
    query: ListQuery = call.query
    filters = {"message_id": query.message_id, "channel": query.channel, "user": query.user, "source": query.source,
               "status": _statuses(query.status)}
    found, next_cursor = await service.list_items(call.store, call.params["queue"], filters, query.limit, query.cursor)
    return {"interactions": found, "next_cursor": next_cursor}


@routes.get("/interactions/{interaction_id}", query=ReadQuery, answer=Interaction, problems=ITEM_PROBLEMS)
async def read_interaction(call: Call[None]) -> Any:
    """An interaction; with `wait_ms`, answers as soon as it is finished (or when the wait is over)."""
    interaction_id = call.params["interaction_id"]
    item = await _check_item_scope(call.ctx, call.principal, interaction_id)
    wait_ms = call.query.wait_ms
    if wait_ms and item["status"] not in service.FINISHED:
        item = await service.wait_finished(call.store, interaction_id, int(call.ctx.wait_s(wait_ms) * 1000))
    return item


@routes.get("/interactions/{interaction_id}/children", query=ChildrenQuery, answer=InteractionList, problems=ITEM_PROBLEMS)
async def list_children(call: Call[None]) -> Any:
    """Children of an interaction (with `name`), oldest first."""
    interaction_id = call.params["interaction_id"]
    await _check_item_scope(call.ctx, call.principal, interaction_id)
    query: ChildrenQuery = call.query
    found, next_cursor = await service.children(call.store, interaction_id, query.name, query.limit, query.cursor)
    return {"interactions": found, "next_cursor": next_cursor}


@routes.get("/interactions/{interaction_id}/children/latest", query=LatestChildQuery, answer=Interaction, problems=ITEM_PROBLEMS)
async def latest_child(call: Call[None]) -> Any:
    """The most recently created child (with `name`)."""
    interaction_id = call.params["interaction_id"]
    await _check_item_scope(call.ctx, call.principal, interaction_id)
    return await service.latest_child(call.store, interaction_id, call.query.name)


@routes.post("/interactions/{interaction_id}/complete", body=CompleteIn, body_required=False, answer=Interaction, problems=ITEM_PROBLEMS)
async def complete(call: Call[CompleteIn | None]) -> Any:
    """Finish as completed with `result`."""
    interaction_id = call.params["interaction_id"]
    await _check_item_scope(call.ctx, call.principal, interaction_id)
    return await service.complete(call.store, interaction_id, call.body.result if call.body else None)


@routes.post("/interactions/{interaction_id}/fail", body=FailIn, answer=Interaction, problems=ITEM_PROBLEMS)
async def fail(call: Call[FailIn]) -> Any:
    """Finish as failed with `error`."""
    interaction_id = call.params["interaction_id"]
    await _check_item_scope(call.ctx, call.principal, interaction_id)
    return await service.fail(call.store, interaction_id, call.body.error)


@routes.post("/interactions/{interaction_id}/cancel", answer=Interaction, problems=ITEM_PROBLEMS)
async def cancel(call: Call[None]) -> Any:
    """Cancel; a worker processing it loses its lease and its handler is cancelled."""
    interaction_id = call.params["interaction_id"]
    await _check_item_scope(call.ctx, call.principal, interaction_id)
    return await service.cancel(call.store, interaction_id)


@routes.post("/interactions/{interaction_id}/schedule", body=ScheduleIn, answer=Interaction, problems=ITEM_PROBLEMS)
async def schedule(call: Call[ScheduleIn]) -> Any:
    """Process at `process_at`, or `process_in_ms` from now."""
    interaction_id = call.params["interaction_id"]
    await _check_item_scope(call.ctx, call.principal, interaction_id)
    due = call.body.due_at(call.now_ms())
    assert due is not None
    return await service.schedule(call.store, interaction_id, due)


@routes.post("/interactions/{interaction_id}/retry", body=RetryIn, body_required=False, answer=Interaction,
             problems={404: "interaction_not_found", 409: "interaction_not_finished / interaction_finished (completed)"})
async def retry(call: Call[RetryIn | None]) -> Any:
    """Run a failed or cancelled interaction again (attempts back to 0), now or `process_in_ms` from now."""
    interaction_id = call.params["interaction_id"]
    await _check_item_scope(call.ctx, call.principal, interaction_id)
    body = call.body
    due = None if body is None or body.process_in_ms is None else call.now_ms() + body.process_in_ms
    return await service.retry(call.store, interaction_id, due)


@routes.patch("/interactions/{interaction_id}", body=ChangeIn, answer=Interaction, problems=ITEM_PROBLEMS)
async def change_data(call: Call[ChangeIn]) -> Any:
    """Replace an unfinished interaction's `data` (event `interaction.changed` with the new data)."""
    interaction_id = call.params["interaction_id"]
    await _check_item_scope(call.ctx, call.principal, interaction_id)
    return await service.change_data(call.store, interaction_id, call.body.data)


@routes.put("/periodic/{name}", body=PeriodicIn, answer=Periodic, problems={422: "invalid cron expression or time zone"})
async def put_periodic(call: Call[PeriodicIn]) -> Any:
    """Create or replace a cron schedule that creates one interaction in `queue` per tick, exactly once
    across all servers (the tick is its idempotency key)."""
    body = call.body
    call.principal.require(f"queues:{body.queue}")
    return await periodic.put_schedule(call.store, call.params["name"], cron=body.cron, queue=body.queue, data_=body.data,
                                       timezone=body.timezone, catch_up_ms=body.catch_up_ms)


@routes.get("/periodic", answer=PeriodicList)
async def list_periodic(call: Call[None]) -> Any:
    """Every schedule whose queue the caller may see."""
    found = [s for s in await periodic.list_schedules(call.store) if call.principal.allows(f"queues:{s['queue']}")]
    return {"periodic": found, "next_cursor": None}


@routes.get("/periodic/{name}", answer=Periodic, problems={404: "periodic_not_found"})
async def get_periodic(call: Call[None]) -> Any:
    """One schedule, with its next tick."""
    found = await periodic.get_schedule(call.store, call.params["name"])
    call.principal.require(f"queues:{found['queue']}")
    return found


@routes.delete("/periodic/{name}", status=204, problems={404: "periodic_not_found"})
async def delete_periodic(call: Call[None]) -> Any:
    """Stop a schedule (interactions it created stay)."""
    name = call.params["name"]
    found = await periodic.get_schedule(call.store, name)
    call.principal.require(f"queues:{found['queue']}")
    await periodic.delete_schedule(call.store, name)


@routes.post("/queues/{queue}/lease", scope=QUEUE, body=LeaseIn, answer=InteractionList)
async def lease(call: Call[LeaseIn]) -> Any:
    """Lease up to `max` due interactions within the queue's limits; `wait_ms` long-polls."""
    cfg = call.settings.interactions
    body = call.body
    wait_ms = int(call.ctx.wait_s(body.wait_ms) * 1000)
    taken = await leasing.lease_wait(call.store, cfg, call.params["queue"], body.worker, body.max, body.lease_ms, wait_ms,
                                     call.settings.server.poll_interval_ms)
    return {"interactions": taken.items, "next_cursor": None}


@routes.post("/queues/{queue}/heartbeat", scope=QUEUE, body=HeartbeatManyIn, answer=HeartbeatManyOut)
async def heartbeat_leases(call: Call[HeartbeatManyIn]) -> Any:
    """Extend many held leases of the queue in one call (a worker's batch); `lease_ms` defaults to the queue's."""
    held, lost = await leasing.heartbeat_in_queue(call.store, call.params["queue"], [(e.id, e.token) for e in call.body.leases],
                                                  call.body.lease_ms)
    return {"held": held, "lease_lost": lost}


@routes.post("/queues/{queue}/release", scope=QUEUE, body=ReleaseManyIn, answer=ReleaseManyOut)
async def release_leases(call: Call[ReleaseManyIn]) -> Any:
    """End many held leases of the queue in one call, each with its outcome; all of them are stored before
    the answer. A lease no longer held changes nothing and is answered in `lease_lost`."""
    released, lost = await leasing.release_in_queue(
        call.store, call.params["queue"], [(e.id, e.token, e.outcome.to_outcome()) for e in call.body.releases])
    return {"released": released, "lease_lost": lost}


@routes.post("/interactions/{interaction_id}/heartbeat", body=HeartbeatIn, answer=HeartbeatOut, problems=ITEM_PROBLEMS)
async def heartbeat(call: Call[HeartbeatIn]) -> Any:
    """Extend a held lease."""
    interaction_id = call.params["interaction_id"]
    if not call.principal.open:
        await _check_item_scope(call.ctx, call.principal, interaction_id)
    expires = await leasing.heartbeat(call.store, interaction_id, call.body.token, call.body.lease_ms)
    return {"expires_at": format_time(expires)}


@routes.post("/interactions/{interaction_id}/release", body=ReleaseIn, answer=Interaction, problems=ITEM_PROBLEMS)
async def release(call: Call[ReleaseIn]) -> Any:
    """End a held lease with an outcome: complete, fail, repeat, wait or retry."""
    interaction_id = call.params["interaction_id"]
    if not call.principal.open:
        await _check_item_scope(call.ctx, call.principal, interaction_id)
    return await leasing.release(call.store, interaction_id, call.body.token, call.body.outcome.to_outcome())


__all__ = ["InteractionNotFound", "routes"]
