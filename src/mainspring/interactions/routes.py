"""HTTP operations of the interactions face (API.md §3): parse → service → answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mainspring.core.errors import Forbidden, InvalidRequest, LeaseLost
from mainspring.core.runtime import Context
from mainspring.core.types import Name
from mainspring.interactions import leasing, periodic, service
from mainspring.interactions.data import InteractionRow
from mainspring.interactions.errors import (
    InteractionFinished,
    InteractionNotFinished,
    InteractionNotFound,
    ParentNotFound,
    PeriodicNotFound,
)
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
from mainspring.web.permissions import All, Filtered, InBody, Owned, Referenced, Scope
from mainspring.web.routing import AnySegment, AsDeclared, Call, Reply, Routes

routes = Routes("/v1", tag="interactions")


async def _item(ctx: Context, interaction_id: str) -> InteractionRow | None:
    try:
        return await service.get(ctx.store, interaction_id)
    except InteractionNotFound:
        return None


async def _schedule(ctx: Context, name: str) -> dict[str, Any] | None:
    try:
        return await periodic.get_schedule(ctx.store, name)
    except PeriodicNotFound:
        return None


def _queue_of(item: InteractionRow) -> str:
    return f"queues:{item.queue}"


def _parents(body: object) -> list[str | None]:
    creates = body.interactions if isinstance(body, BulkCreateIn) else [body] if isinstance(body, CreateIn) else []
    return [None if c.parent_id is None else str(c.parent_id) for c in creates]


QUEUE = Scope("queues:{queue}")
# An item of a queue the token may not touch is answered as an unknown id is.
ITEM = Owned("interaction_id", _item, _queue_of, lambda key: InteractionNotFound(f"no interaction {key}"),
             shown_as="queues:<the interaction's queue>")
# A parent in a queue the token may not touch is answered as an unknown parent is (no child is injected).
PARENTS = Referenced(_parents, _item, _queue_of, lambda key: ParentNotFound(f"no interaction {key}"),
                     shown_as="queues:<each parent_id's queue>")
SCHEDULE = Owned("name", _schedule, lambda s: f"queues:{s['queue']}", lambda name: PeriodicNotFound(f"no schedule {name!r}"),
                 shown_as="queues:<the schedule's stored queue>")
ITEM_PROBLEMS = [InteractionFinished, LeaseLost]


@routes.put("/queues/{queue}", permission=QUEUE)
async def put_queue(call: Call, queue: Name, body: QueueSettingsIn) -> QueueOut:
    """Set a queue's limits and timings; every server applies them at its next lease."""
    return QueueOut.model_validate(await service.put_queue(call.store, call.settings.interactions, queue, body.model_dump()))


@routes.get("/queues/{queue}", permission=QUEUE)
async def get_queue(call: Call, queue: Name) -> QueueOut:
    """A queue's settings and its interactions counted by status."""
    return QueueOut.model_validate(await service.get_queue(call.store, call.settings.interactions, queue))


@routes.post("/queues/{queue}/pause", permission=QUEUE)
async def pause_queue(call: Call, queue: Name) -> QueueOut:
    """Stop leasing from the queue on every server (items leased already run on); event ``interaction.queue.paused``."""
    return QueueOut.model_validate(await service.pause_queue(call.store, call.settings.interactions, queue, True))


@routes.post("/queues/{queue}/resume", permission=QUEUE)
async def resume_queue(call: Call, queue: Name) -> QueueOut:
    """Lease from a paused queue again; event ``interaction.queue.resumed``."""
    return QueueOut.model_validate(await service.pause_queue(call.store, call.settings.interactions, queue, False))


@routes.post("/queues/{queue}/interactions", permission=All(QUEUE, PARENTS), status=201,
             answers={200: "the existing interaction with this message_id"})
async def create_interaction(call: Call, queue: Name, body: CreateIn) -> Interaction | Reply:
    """Create an interaction (201), or answer the existing one of this queue with the same `message_id` (200)."""
    item, created = await service.create(call.store, call.settings.interactions, queue, service.spec_from(body, call.now_ms()))
    answer = Interaction.model_validate(item)
    return answer if created else Reply(answer, status=200)


@routes.post("/queues/{queue}/interactions/bulk", permission=All(QUEUE, PARENTS), status=201)
async def create_interactions(call: Call, queue: Name, body: BulkCreateIn) -> InteractionList:
    """Create many interactions in one transaction (all or none), in request order."""
    now = call.now_ms()
    results = await service.create_many(call.store, call.settings.interactions, queue,
                                        [service.spec_from(b, now) for b in body.interactions])
    return InteractionList.model_validate({"interactions": [item for item, _ in results], "next_cursor": None})


def _statuses(value: str | None) -> list[str] | None:
    if not value:
        return None
    wanted = [s for s in value.split(",") if s]
    bad = [s for s in wanted if s not in service.STATUSES]
    if bad:
        raise InvalidRequest(f"unknown status {bad[0]!r}", errors=[{"loc": ["query", "status"], "msg": f"one of {', '.join(service.STATUSES)}"}])
    return wanted


@routes.get("/queues/{queue}/interactions", permission=QUEUE)
async def list_interactions(call: Call, queue: Name, query: ListQuery) -> InteractionList:
    """A queue's interactions, oldest first."""
    filters = {"message_id": query.message_id, "channel": query.channel, "user": query.user, "source": query.source,
               "status": _statuses(query.status)}
    found, next_cursor = await service.list_items(call.store, queue, filters, query.limit, query.cursor)
    return InteractionList.model_validate({"interactions": found, "next_cursor": next_cursor})


@routes.get("/interactions/{interaction_id}", permission=ITEM)
async def read_interaction(call: Call, interaction_id: AnySegment, query: ReadQuery) -> Interaction:
    """An interaction; with `wait_ms`, answers as soon as it is finished (or when the wait is over)."""
    item = await service.read(call.store, interaction_id)
    if query.wait_ms and item["status"] not in service.FINISHED:
        item = await service.wait_finished(call.store, interaction_id, int(call.ctx.wait_s(query.wait_ms) * 1000))
    return Interaction.model_validate(item)


@routes.get("/interactions/{interaction_id}/children", permission=ITEM)
async def list_children(call: Call, interaction_id: AnySegment, query: ChildrenQuery) -> InteractionList:
    """Children of an interaction (with `name`), oldest first."""
    found, next_cursor = await service.children(call.store, interaction_id, query.name, query.limit, query.cursor)
    return InteractionList.model_validate({"interactions": found, "next_cursor": next_cursor})


@routes.get("/interactions/{interaction_id}/children/latest", permission=ITEM, problems=[InteractionNotFound])
async def latest_child(call: Call, interaction_id: AnySegment, query: LatestChildQuery) -> Interaction:
    """The most recently created child (with `name`)."""
    return Interaction.model_validate(await service.latest_child(call.store, interaction_id, query.name))


@routes.post("/interactions/{interaction_id}/complete", permission=ITEM, problems=ITEM_PROBLEMS)
async def complete(call: Call, interaction_id: AnySegment, body: CompleteIn | None) -> Interaction:
    """Finish as completed with `result`."""
    return Interaction.model_validate(await service.complete(call.store, interaction_id, body.result if body else None))


@routes.post("/interactions/{interaction_id}/fail", permission=ITEM, problems=ITEM_PROBLEMS)
async def fail(call: Call, interaction_id: AnySegment, body: FailIn) -> Interaction:
    """Finish as failed with `error`."""
    return Interaction.model_validate(await service.fail(call.store, interaction_id, body.error))


@routes.post("/interactions/{interaction_id}/cancel", permission=ITEM, problems=ITEM_PROBLEMS)
async def cancel(call: Call, interaction_id: AnySegment) -> Interaction:
    """Cancel; a worker processing it loses its lease and its handler is cancelled."""
    return Interaction.model_validate(await service.cancel(call.store, interaction_id))


@routes.post("/interactions/{interaction_id}/schedule", permission=ITEM, problems=ITEM_PROBLEMS)
async def schedule(call: Call, interaction_id: AnySegment, body: ScheduleIn) -> Interaction:
    """Process at `process_at`, or `process_in_ms` from now."""
    due = body.due_at(call.now_ms())
    assert due is not None
    return Interaction.model_validate(await service.schedule(call.store, interaction_id, due))


@routes.post("/interactions/{interaction_id}/retry", permission=ITEM, problems=[InteractionNotFinished, InteractionFinished])
async def retry(call: Call, interaction_id: AnySegment, body: RetryIn | None) -> Interaction:
    """Run a failed or cancelled interaction again (attempts back to 0), now or `process_in_ms` from now."""
    due = None if body is None or body.process_in_ms is None else call.now_ms() + body.process_in_ms
    return Interaction.model_validate(await service.retry(call.store, interaction_id, due))


@routes.patch("/interactions/{interaction_id}", permission=ITEM, problems=ITEM_PROBLEMS)
async def change_data(call: Call, interaction_id: AnySegment, body: ChangeIn) -> Interaction:
    """Replace an unfinished interaction's `data` (event `interaction.changed` with the new data)."""
    return Interaction.model_validate(await service.change_data(call.store, interaction_id, body.data))


# Both the schedule's stored queue (whose schedule it is) and the body's (where it will create items).
@routes.put("/periodic/{name}", permission=All(
    Owned("name", _schedule, lambda s: f"queues:{s['queue']}", lambda name: Forbidden(f"schedule {name!r} is of another queue"),
          unknown=lambda _: True, shown_as="queues:<the stored schedule's queue, when there is one>"),
    InBody(lambda body: [f"queues:{body.queue}"] if isinstance(body, PeriodicIn) else [], shown_as="queues:<the body's queue>")))
async def put_periodic(call: Call, name: Name, body: PeriodicIn) -> Periodic:
    """Create or replace a cron schedule that creates one interaction in `queue` per tick, exactly once
    across all servers (the tick is its idempotency key)."""
    return Periodic.model_validate(await periodic.put_schedule(call.store, name, cron=body.cron, queue=body.queue, data_=body.data,
                                                               timezone=body.timezone, catch_up_ms=body.catch_up_ms))


@routes.get("/periodic", permission=Filtered("periodic", lambda s: f"queues:{s.queue}", shown_as="queues:<queue>"))
async def list_periodic(call: Call) -> PeriodicList:
    """Every schedule whose queue the caller may see."""
    return PeriodicList.model_validate({"periodic": await periodic.list_schedules(call.store), "next_cursor": None})


@routes.get("/periodic/{name}", permission=SCHEDULE)
async def get_periodic(call: Call, name: Name) -> Periodic:
    """One schedule, with its next tick."""
    return Periodic.model_validate(await periodic.get_schedule(call.store, name))


@routes.delete("/periodic/{name}", permission=SCHEDULE, status=204)
async def delete_periodic(call: Call, name: Name) -> None:
    """Stop a schedule (interactions it created stay)."""
    await periodic.get_schedule(call.store, name)
    await periodic.delete_schedule(call.store, name)


@routes.post("/queues/{queue}/lease", permission=QUEUE)
async def lease(call: Call, queue: Name, body: LeaseIn) -> InteractionList | AsDeclared:
    """Lease up to `max` due interactions within the queue's limits; `wait_ms` long-polls."""
    wait_ms = int(call.ctx.wait_s(body.wait_ms) * 1000)
    taken = await leasing.lease_wait(call.store, call.settings.interactions, queue, body.worker, body.max, body.lease_ms,
                                     wait_ms, call.settings.server.poll_interval_ms)
    # The items are service.to_api's: an Interaction's fields already, sent without building 50 models.
    return AsDeclared({"interactions": taken.items, "next_cursor": None})


E = TypeVar("E", bound=tuple[Any, ...])


async def in_turn(entries: list[E], run: Callable[[list[E]], Awaitable[tuple[list[str], list[str]]]], *,
                  repeat_done: bool) -> tuple[list[str], list[str]]:
    """(ids done, ids not held) for entries ``(id, token, …)`` that may name an id more than once: each is
    taken as if sent after the ones before it. ``run`` takes a list in which each id appears once, so the
    distinct ``(id, token)`` go in rounds — the first token of each id, then the second… — and an id done in
    one round is not tried again (a lease has one token). A repeat of an entry is answered as done when
    ``repeat_done`` (a heartbeat again) and otherwise as not held (a release finds the lease gone), without a
    round of its own: a list of one entry a thousand times costs one round."""
    ids = [entry[0] for entry in entries]
    if len(set(ids)) == len(ids):
        # Each id once (a worker's batch): one round, answered in the entries' order.
        yes, _ = await run(entries)
        held = set(yes)
        return [i for i in ids if i in held], [i for i in ids if i not in held]
    firsts: dict[tuple[object, object], int] = {}
    for index, entry in enumerate(entries):
        firsts.setdefault((entry[0], entry[1]), index)
    rounds: list[list[int]] = []
    turns: dict[str, int] = {}
    for index in firsts.values():
        turn = turns[entries[index][0]] = turns.get(entries[index][0], -1) + 1
        if turn == len(rounds):
            rounds.append([])
        rounds[turn].append(index)
    done: set[int] = set()
    settled: set[str] = set()
    for indexes in rounds:
        tried = [i for i in indexes if entries[i][0] not in settled]
        if not tried:
            continue
        yes, _ = await run([entries[i] for i in tried])
        held = set(yes)
        done.update(i for i in tried if entries[i][0] in held)
        settled.update(held)
    answered = [index in done or (repeat_done and firsts[(entry[0], entry[1])] in done) for index, entry in enumerate(entries)]
    return ([e[0] for e, ok in zip(entries, answered, strict=True) if ok],
            [e[0] for e, ok in zip(entries, answered, strict=True) if not ok])


@routes.post("/queues/{queue}/heartbeat", permission=QUEUE)
async def heartbeat_leases(call: Call, queue: Name, body: HeartbeatManyIn) -> HeartbeatManyOut:
    """Extend many held leases of the queue in one call (a worker's batch); `lease_ms` defaults to the queue's.
    An id given more than once is answered once per entry, as if each were sent after the ones before it."""
    held, lost = await in_turn([(e.id, e.token) for e in body.leases],
                               lambda entries: leasing.heartbeat_in_queue(call.store, queue, entries, body.lease_ms),
                               repeat_done=True)
    return HeartbeatManyOut(held=held, lease_lost=lost)


@routes.post("/queues/{queue}/release", permission=QUEUE)
async def release_leases(call: Call, queue: Name, body: ReleaseManyIn) -> ReleaseManyOut:
    """End many held leases of the queue in one call, each with its outcome; all of them are stored before
    the answer. A lease no longer held changes nothing and is answered in `lease_lost`. An id given more than
    once is taken in order: its first entry with the lease's token releases it, any later one finds it gone."""
    released, lost = await in_turn([(e.id, e.token, e.outcome.to_outcome()) for e in body.releases],
                                   lambda entries: leasing.release_in_queue(call.store, queue, entries),
                                   repeat_done=False)
    return ReleaseManyOut(released=released, lease_lost=lost)


@routes.post("/interactions/{interaction_id}/heartbeat", permission=ITEM, problems=ITEM_PROBLEMS)
async def heartbeat(call: Call, interaction_id: AnySegment, body: HeartbeatIn) -> HeartbeatOut:
    """Extend a held lease."""
    expires = await leasing.heartbeat(call.store, interaction_id, body.token, body.lease_ms)
    return HeartbeatOut.model_validate({"expires_at": format_time(expires)})


@routes.post("/interactions/{interaction_id}/release", permission=ITEM, problems=ITEM_PROBLEMS)
async def release(call: Call, interaction_id: AnySegment, body: ReleaseIn) -> Interaction:
    """End a held lease with an outcome: complete, fail, repeat, wait or retry."""
    return Interaction.model_validate(await leasing.release(call.store, interaction_id, body.token, body.outcome.to_outcome()))


__all__ = ["InteractionNotFound", "routes"]
