"""The dashboard's pages (GET): they read through the faces' services, and ``queries`` where no face
offers the view (counts across names, lists of names, throughput)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal, cast

from pydantic import Field
from sse_starlette import ServerSentEvent
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from mainspring.batching import cafe
from mainspring.batching import service as batching
from mainspring.batching.errors import PackageNotFound
from mainspring.core import alerts, outbox
from mainspring.core.auth import Principal
from mainspring.core.errors import MainspringError
from mainspring.core.types import Name
from mainspring.events_and_alerts import event_position, event_stream, event_types
from mainspring.exchange import messages as exchange_messages
from mainspring.exchange import service as exchange
from mainspring.exchange.errors import MessageNotFound
from mainspring.exchange.models import STATES as EXCHANGE_STATES
from mainspring.interactions import service as interactions
from mainspring.machines import namespaces as machine_namespaces
from mainspring.machines import service as machines
from mainspring.machines.models import MachineName
from mainspring.machines.settings import HistoryRange
from mainspring.ui import queries
from mainspring.ui.web import VIEWER, PageQuery, Pages, machine_name, machine_path, render, request_context
from mainspring.workflows import service as workflows

pages = Pages("/ui")
HISTORY_PAGE = 20
LIST_PAGE = 200
IN_DOUBT_SHOWN = 100
# A message page shows this much of the body; the rest is cut with a note (bodies may be up to 16 MiB).
BODY_SHOWN = 64 * 1024
OPEN_PROCESS_STATES = ("STARTED", "READY_TO_COMMIT", "IN_DOUBT", "CLEANUP")


class Paged(PageQuery):
    cursor: str | None = Field(None, max_length=200)


class ExchangeQuery(Paged):
    state: Literal["STARTED", "READY_TO_COMMIT", "CLEANUP", "DONE", "CANCELLED", "ABORTED", "IN_DOUBT"] | None = None


class MachinesQuery(Paged):
    ns: MachineName | None = None
    id: str | None = Field(None, max_length=1024)
    status: Literal["working", "failed"] | None = None


class MachineQuery(PageQuery):
    after: int | None = Field(None, ge=0)
    direction: Literal["forward", "backward"] = "backward"


class QueueQuery(Paged):
    status: str | None = Field(None, max_length=20)


class BatcherQuery(PageQuery):
    task: Name | None = None
    group: Name | None = None
    package: Name | None = None
    package_status: Literal["ready", "claimed", "done", "failed"] | None = None


class WorkflowsQuery(Paged):
    name: str | None = Field(None, max_length=100)
    status: Literal["running", "sleeping", "waiting", "completed", "failed", "cancelled"] | None = None


class EventsQuery(PageQuery):
    types: str | None = Field(None, max_length=2000)


class StreamQuery(EventsQuery):
    after: str | None = Field(None, max_length=20)


@pages.get("", permission=VIEWER)
@pages.get("/", permission=VIEWER)
async def overview(request: Request, principal: Principal) -> Response:
    """Per face counts by state, throughput over the last hour, open alerts."""
    return render(request, "overview.html", **await _overview_values(request))


@pages.get("/overview/live", permission=VIEWER)
async def overview_live(request: Request, principal: Principal) -> Response:
    """The live part of the overview, polled by htmx."""
    return render(request, "_overview_live.html", **await _overview_values(request))


async def _overview_values(request: Request) -> dict[str, Any]:
    ctx = request_context(request)
    open_alerts, _ = await alerts.list_alerts(ctx.store, open_only=True, limit=50, cursor=None)
    latest, _ = await alerts.list_alerts(ctx.store, open_only=False, limit=50, cursor=None)
    return {
        "closed": [a for a in latest if a["resolved_at"]][:10],
        "counts": await queries.face_counts(ctx),
        "throughput": await queries.throughput(ctx),
        "latency": await queries.latency(ctx),
        "alerts": open_alerts,
        "page": "overview",
    }


# --- exchange --------------------------------------------------------------------------------------


@pages.get("/exchange", permission=VIEWER, query=ExchangeQuery)
async def exchange_page(request: Request, principal: Principal, query: ExchangeQuery) -> Response:
    ctx = request_context(request)
    state, cursor = query.state, query.cursor
    # Finished processes pile up; by default show the ones someone may need to look at. One state at a
    # time pages through all of its processes.
    processes: list[exchange.ProcessView] = []
    next_cursor: str | None = None
    more_in: list[str] = []
    if state:
        listed = await exchange.list_processes(ctx, state=state, addressee=None, database=None, limit=LIST_PAGE, cursor=cursor)
        processes, next_cursor = listed["processes"], listed["next_cursor"]
    else:
        for wanted in OPEN_PROCESS_STATES:
            listed = await exchange.list_processes(ctx, state=wanted, addressee=None, database=None, limit=LIST_PAGE, cursor=None)
            processes.extend(listed["processes"])
            if listed["next_cursor"]:
                more_in.append(wanted)
        processes.sort(key=lambda p: (p["started_at"], p["id"]))
    in_doubt = await exchange.list_processes(ctx, state="IN_DOUBT", addressee=None, database=None, limit=IN_DOUBT_SHOWN, cursor=None)
    ids = [p["id"] for p in in_doubt["processes"]]
    return render(
        request,
        "exchange.html",
        page="exchange",
        mailboxes=await exchange_messages.list_mailboxes(ctx),
        processes=processes,
        next_cursor=next_cursor,
        more_in=more_in,
        page_size=LIST_PAGE,
        in_doubt=in_doubt["processes"],
        more_in_doubt=in_doubt["next_cursor"] is not None,
        quarantined=await exchange.held_messages(ctx, ids),
        cleanup=await exchange.failing_file_moves(ctx),
        states=EXCHANGE_STATES,
        state=state,
    )


@pages.get("/exchange/mailboxes/{addressee}/{database}", permission=VIEWER, query=Paged, names=("addressee", "database"))
async def mailbox_page(request: Request, principal: Principal, query: Paged, addressee: str, database: str) -> Response:
    ctx = request_context(request)
    listed = await exchange_messages.list_available(ctx, addressee, database, limit=LIST_PAGE, cursor=query.cursor)
    return render(request, "mailbox.html", page="exchange", addressee=addressee, database=database, listed=listed)


@pages.get("/exchange/processes/{process_id}", permission=VIEWER, names=("process_id",))
async def process_page(request: Request, principal: Principal, process_id: str) -> Response:
    """A process with its messages (where their files are now), and the resolve buttons while IN_DOUBT."""
    ctx = request_context(request)
    process = await exchange.get_process(ctx, process_id)
    messages = (await exchange.held_messages(ctx, [process_id]))[process_id]
    return render(request, "process.html", page="exchange", p=process, messages=messages)


@pages.get("/exchange/messages/{message_id}", permission=VIEWER, names=("message_id",))
async def message_page(request: Request, principal: Principal, message_id: str) -> Response:
    """A message with its body: the first ``BODY_SHOWN`` bytes, decoded as UTF-8 (a body that is not text
    shows its replacement characters: the page is for a look, the API gives the bytes)."""
    ctx = request_context(request)
    message = await exchange_messages.inspect_message(ctx, message_id)
    if message is None:
        raise MessageNotFound(f"no message {message_id}")
    body: str | None = None
    unreadable: str | None = None
    try:
        _, data = await exchange_messages.read_message(ctx, message["addressee"], message["database"], message_id)
        body = data[:BODY_SHOWN].decode("utf-8", errors="replace")
    except MainspringError as exc:
        unreadable = cast(str, exc.problem()["detail"])
    return render(request, "message.html", page="exchange", m=message, body=body, unreadable=unreadable, shown=BODY_SHOWN)


# --- machines --------------------------------------------------------------------------------------


@pages.get("/machines/namespaces/{ns}", permission=VIEWER)
async def namespace_page(request: Request, principal: Principal, ns: str) -> Response:
    """A namespace's processor, retry policy and history range, and its machines counted by status."""
    ctx = request_context(request)
    ns = machine_name(ns)
    namespace = (await machine_namespaces.get_namespace(ctx, ns)).to_api(ctx)
    return render(request, "namespace.html", page="machines", ns=namespace, counts=await machines.namespace_counts(ctx, ns))


@pages.get("/machines", permission=VIEWER, query=MachinesQuery)
async def machines_page(request: Request, principal: Principal, query: MachinesQuery) -> Response:
    ctx = request_context(request)
    ns, id, status, cursor = query.ns, query.id, query.status, query.cursor
    if ns and id:
        return RedirectResponse(f"/ui/machines/{machine_path(ns, id)}", status_code=303)
    found: list[machines.MachineSummary] | list[machines.MachineListed]
    next_cursor: str | None = None
    if ns:
        found, next_cursor = await machines.list_machines(ctx, ns, status, LIST_PAGE, cursor)
    else:
        # Across namespaces the search is by id substring: the first page only; a namespace pages.
        found = await machines.search_machines(ctx, status, id, LIST_PAGE)
    return render(
        request, "machines.html", page="machines", machines=found, namespaces=await machines.namespace_names(ctx),
        ns=ns, id=id, status=status, next_cursor=next_cursor, page_size=LIST_PAGE,
    )


@pages.get("/machines/{ns}/{machine_id}", permission=VIEWER, query=MachineQuery)
async def machine_page(request: Request, principal: Principal, query: MachineQuery, ns: str, machine_id: str) -> Response:
    """A machine with one page of its history (newest first by default), aux state, timer, failure
    journal and pending notifications."""
    ctx = request_context(request)
    ns, machine_id = machine_name(ns), machine_name(machine_id)
    direction = query.direction
    rng = HistoryRange(after=query.after, limit=HISTORY_PAGE, direction=direction)
    machine = await machines.get_machine(ctx, ns, machine_id, rng)
    history = machine["history"]
    ids = [h["id"] for h in history]
    return render(
        request, "machine.html", page="machines", m=machine, history=history, direction=direction,
        next_after=(ids[-1] if len(ids) == HISTORY_PAGE else None),
        notifications=await machines.pending_notifications(ctx, ns, machine_id),
    )


# --- workflows -------------------------------------------------------------------------------------


@pages.get("/workflows", permission=VIEWER, query=WorkflowsQuery)
async def workflows_page(request: Request, principal: Principal, query: WorkflowsQuery) -> Response:
    """Every workflow with its runs counted by status; the runs of one (by status)."""
    ctx = request_context(request)
    summaries = await workflows.workflow_summaries(ctx)
    runs: list[workflows.RunView] = []
    next_cursor: str | None = None
    name = query.name or (summaries[0]["name"] if len(summaries) == 1 else None)
    if name:
        runs, next_cursor = await workflows.list_runs(ctx, name, query.status, LIST_PAGE, query.cursor)
    return render(request, "workflows.html", page="workflows", workflows=summaries, runs=runs, workflow=name, status=query.status,
                  next_cursor=next_cursor, statuses=workflows.STATUSES)


@pages.get("/workflows/{name}/{run_id}", permission=VIEWER)
async def run_page(request: Request, principal: Principal, name: str, run_id: str) -> Response:
    """A run: its status, args, result or error, what it waits for, its steps as a timeline (signals and waits
    among them) and the signals not taken yet."""
    ctx = request_context(request)
    name, run_id = machine_name(name), machine_name(run_id)
    run = await workflows.get_run(ctx, name, run_id)
    pending = [n for n in await machines.pending_notifications(ctx, name, run_id) if isinstance(n["args"], dict)]
    return render(request, "workflow_run.html", page="workflows", run=run, pending=pending)


# --- interactions ----------------------------------------------------------------------------------


@pages.get("/interactions", permission=VIEWER)
async def interactions_page(request: Request, principal: Principal) -> Response:
    ctx = request_context(request)
    cfg = ctx.settings.interactions
    found = [await interactions.get_queue(ctx.store, cfg, q) for q in await queries.queue_names(ctx)]
    return render(request, "interactions.html", page="interactions", queues=found, statuses=interactions.STATUSES)


@pages.get("/interactions/queues/{queue}", permission=VIEWER, query=QueueQuery)
async def queue_page(request: Request, principal: Principal, query: QueueQuery, queue: str) -> Response:
    ctx = request_context(request)
    status = query.status if query.status in interactions.STATUSES else None
    cursor = query.cursor
    settings = await interactions.get_queue(ctx.store, ctx.settings.interactions, queue)
    filters = {"status": [status] if status else None}
    found, next_cursor = await interactions.list_items(ctx.store, queue, filters, 100, cursor)
    owners = await interactions.busiest_owners(ctx.store, queue) if settings["owner_by"] else []
    return render(
        request, "queue.html", page="interactions", queue=settings, items=found, next_cursor=next_cursor,
        status=status, statuses=interactions.STATUSES, owners=owners,
    )


@pages.get("/interactions/items/{interaction_id}", permission=VIEWER)
async def interaction_page(request: Request, principal: Principal, interaction_id: str) -> Response:
    """An interaction with its parents above and two levels of children below."""
    ctx = request_context(request)
    item = await interactions.read(ctx.store, interaction_id)
    children, _ = await interactions.children(ctx.store, item["id"], None, 100, None)
    grandchildren: dict[str, list[dict[str, object]]] = {}
    for child in children[:30]:
        grandchildren[child["id"]], _ = await interactions.children(ctx.store, child["id"], None, 30, None)
    return render(
        request, "interaction.html", page="interactions", item=item, children=children, grandchildren=grandchildren,
        ancestors=await queries.interaction_ancestors(ctx, item["parent_id"]), finished=interactions.FINISHED,
    )


# --- batching --------------------------------------------------------------------------------------


@pages.get("/batching", permission=VIEWER)
async def batching_page(request: Request, principal: Principal) -> Response:
    ctx = request_context(request)
    found = [await batching.get_batcher(ctx.store, name) for name in await queries.batcher_names(ctx)]
    return render(request, "batching.html", page="batching", batchers=found)


# A batcher's page lists this many tasks of each package (a hundred packages of a hundred tasks took 631 ms to
# show, issue 26); a package's link shows all of its tasks.
TASKS_PER_PACKAGE = 10


@pages.get("/batching/{name}", permission=VIEWER, query=BatcherQuery)
async def batcher_page(request: Request, principal: Principal, query: BatcherQuery, name: str) -> Response:
    """A batcher's settings, the batch forming with its timer, packages and leases; a task's status and
    a group's version log on request."""
    ctx = request_context(request)
    task, group, package_status = query.task, query.group, query.package_status
    batcher = await batching.get_batcher(ctx.store, name)
    packages, _ = await cafe.list_packages(ctx.store, name, package_status, 100, None, TASKS_PER_PACKAGE)
    found_task: batching.TaskView | None = None
    found_package: cafe.PackageView | None = None
    task_error: str | None = None
    try:
        if task:
            found_task = await batching.get_task(ctx.store, name, task)
        if query.package:
            package = await cafe.get_package(ctx.store, query.package)
            # A package looked up from batcher ``name``'s page must be one of its own.
            if package["batcher"] != name:
                raise PackageNotFound(f"no package of batcher {name!r} by that id")
            found_package = package
    except MainspringError as exc:
        task_error = cast(str, exc.problem()["detail"])
    return render(
        request, "batcher.html", page="batching", b=batcher, forming=await queries.forming_batch(ctx, name),
        packages=packages, leases=await queries.package_leases(ctx, name), task=task, found_task=found_task,
        task_error=task_error, group=group, versions=(await queries.group_versions(ctx, name, group)) if group else None,
        package_status=package_status, found_package=found_package, tasks_per_package=TASKS_PER_PACKAGE,
    )


# --- events ----------------------------------------------------------------------------------------


@pages.get("/events", permission=VIEWER, query=EventsQuery)
async def events_page(request: Request, principal: Principal, query: EventsQuery) -> Response:
    """The latest events, then a live tail over Server-Sent Events from where the page left off."""
    ctx = request_context(request)
    types = query.types
    top = await outbox.head_position(ctx.store)
    wanted = [t.strip() for t in (types or "").split(",") if t.strip()]
    recent, _ = await outbox.read_events(ctx.store, max(0, top - 50), 50, wanted)
    return render(request, "events.html", page="events", recent=list(reversed(recent)), cursor=str(top), types=types or "")


@pages.get("/events/stream", permission=VIEWER, query=StreamQuery)
async def events_stream(request: Request, principal: Principal, query: StreamQuery) -> Response:
    """The API's event stream (same code), for the browser that holds the token in its cookie. Each
    event goes out unnamed, so a browser's ``onmessage`` sees every type (the type is in the data)."""
    position = event_position(request.headers.get("last-event-id") or query.after)
    response = event_stream(request_context(request), position, event_types(query.types))
    named = response.body_iterator

    async def unnamed() -> AsyncIterator[object]:
        async for item in named:
            if isinstance(item, ServerSentEvent):
                item.event = None
            yield item

    response.body_iterator = unnamed()
    return response
