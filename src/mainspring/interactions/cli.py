"""``mainspring interactions``: find, inspect, create, retry, cancel and reschedule interactions of a
running server, over its HTTP API (``--url``/``--token`` with scope ``queues:<queue>``)."""

from __future__ import annotations

from typing import Annotated

import typer

from mainspring.client.interactions import InteractionsClient
from mainspring.core.cli import (
    DEFAULT_URL,
    CommandGroup,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    each,
    json_arg,
    out,
    print_json,
    print_table,
)

cli = typer.Typer(help="Interactions of a running server: list, show, create, retry, cancel, schedule.", no_args_is_help=True, cls=CommandGroup)

QueueArg = Annotated[str, typer.Argument(metavar="QUEUE", help="The queue.", show_default=False)]
IdArg = Annotated[str, typer.Argument(metavar="ID", help="The interaction.", show_default=False)]
IdsArg = Annotated[list[str], typer.Argument(metavar="ID...", help="One or more interactions.", show_default=False)]
InMsOpt = Annotated[int | None, typer.Option("--in-ms", min=0, help="Due this many ms from now.", show_default="now")]
COLUMNS = ["id", "status", "name", "message_id", "attempts", "next_processing", "error", "updated_at"]


@cli.command("list")
def list_command(
    queue: QueueArg,
    status: Annotated[str | None, typer.Option(help="Comma-separated statuses (failed, ready, waiting…).", show_default="all")] = None,
    channel: Annotated[str | None, typer.Option(show_default=False)] = None,
    user: Annotated[str | None, typer.Option(show_default=False)] = None,
    source: Annotated[str | None, typer.Option(show_default=False)] = None,
    message_id: Annotated[str | None, typer.Option("--message-id", show_default=False)] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many.", show_default="all")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A queue's interactions, oldest first, every page (filters as in the HTTP list)."""
    found = []
    with InteractionsClient(url, token) as client:
        for item in client.iterate(queue, status=status, channel=channel, user=user, source=source, message_id=message_id):
            found.append(item)
            if limit is not None and len(found) >= limit:
                break
    if as_json:
        print_json(found)
    else:
        print_table(f"interactions of {queue}", COLUMNS, [dict(i) for i in found], ids=("id", "message_id"))


@cli.command("show")
def show_command(item_id: IdArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """An interaction with its children: data, result, error, schedule."""
    with InteractionsClient(url, token) as client:
        item = client.get(item_id)
        children = list(client.children(item_id, limit=1000)["interactions"])
    if as_json:
        print_json({**item, "children": children})
        return
    print_json(item)
    if children:
        print_table("children", ["id", "name", "queue", "status", "attempts", "error"], [dict(c) for c in children])


@cli.command("create")
def create_command(
    queue: QueueArg,
    data: Annotated[str | None, typer.Option(help="The item's data, as JSON.", show_default="null")] = None,
    message_id: Annotated[str | None, typer.Option("--message-id", help="Idempotency key, unique per queue.", show_default=False)] = None,
    parent_id: Annotated[str | None, typer.Option("--parent-id", help="Make it a child of this interaction.", show_default=False)] = None,
    name: Annotated[str | None, typer.Option(help="Its name among the parent's children.", show_default=False)] = None,
    priority: Annotated[int | None, typer.Option(help="Higher first, -1000..1000.", show_default="0")] = None,
    user: Annotated[str | None, typer.Option(help="Its user (an owner, when the queue's owner_by is user).", show_default=False)] = None,
    source: Annotated[str | None, typer.Option(help="Its source.", show_default=False)] = None,
    channel: Annotated[str | None, typer.Option(help="Its channel.", show_default=False)] = None,
    in_ms: InMsOpt = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Create an interaction and print it."""
    with InteractionsClient(url, token) as client:
        item = client.create(queue, json_arg(data, "--data"), message_id=message_id, parent_id=parent_id, name=name,
                             priority=priority, user=user, source=source, channel=channel, process_in_ms=in_ms)
    print_json(item)


@cli.command("retry")
def retry_command(ids: IdsArg, in_ms: InMsOpt = None, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Try failed (or cancelled) interactions again: attempts reset, due now (or --in-ms)."""
    with InteractionsClient(url, token) as client:
        for item_id in each(ids, "retrying"):
            item = client.retry(item_id, process_in_ms=in_ms)
            out.print(f"{item['id']} {item['status']}", markup=False)


@cli.command("cancel")
def cancel_command(ids: IdsArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Cancel interactions (and their unfinished children); running handlers are cancelled."""
    with InteractionsClient(url, token) as client:
        for item_id in each(ids, "cancelling"):
            item = client.cancel(item_id)
            out.print(f"{item['id']} {item['status']}", markup=False)


@cli.command("schedule")
def schedule_command(
    ids: IdsArg,
    in_ms: InMsOpt = None,
    at: Annotated[str | None, typer.Option(help="Due at this RFC 3339 time.", show_default=False)] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Make unfinished interactions due at --at or --in-ms from now."""
    if (in_ms is None) == (at is None):
        raise typer.BadParameter("give exactly one of --in-ms and --at")
    with InteractionsClient(url, token) as client:
        for item_id in each(ids, "scheduling"):
            item = client.schedule(item_id, process_at=at, process_in_ms=in_ms)
            out.print(f"{item['id']} {item['status']} {item['next_processing'] or ''}".rstrip(), markup=False)


@cli.command("queue")
def queue_command(queue: QueueArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """A queue's settings (limits, priority aging, owners and fair shares) and its counts by status, as JSON."""
    with InteractionsClient(url, token) as client:
        print_json(client.get_queue(queue))
