"""``mainspring interactions``: find, inspect, create, retry, cancel and reschedule interactions of a
running server, over its HTTP API (``--url``/``--token`` with scope ``queues:<queue>``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

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

cli = typer.Typer(help="Interactions of a running server: list, show, create, retry, cancel, schedule; queues: pause, resume, "
                  "settings; cron schedules.", no_args_is_help=True, cls=CommandGroup)
schedules_cli = typer.Typer(help="Cron schedules (also @app.periodic's): list, put, delete.", no_args_is_help=True, cls=CommandGroup)
cli.add_typer(schedules_cli, name="schedules")

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


@cli.command("pause")
def pause_command(queue: QueueArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Stop leasing from a queue on every server (items leased already run on)."""
    with InteractionsClient(url, token) as client:
        client.pause_queue(queue)
    out.print(f"{queue} paused", markup=False)


@cli.command("resume")
def resume_command(queue: QueueArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Lease from a paused queue again."""
    with InteractionsClient(url, token) as client:
        client.resume_queue(queue)
    out.print(f"{queue} resumed", markup=False)


MsOpt = Annotated[int | None, typer.Option(min=0, show_default="unchanged")]


@cli.command("settings")
def settings_command(
    queue: QueueArg,
    concurrency: Annotated[int | None, typer.Option(min=1, help="At most this many leased at once, across servers.", show_default="unchanged")] = None,
    rate_limit: Annotated[str | None, typer.Option("--rate-limit", help='At most count lease starts in any per_ms, as JSON: \'{"count": 5, "per_ms": 1000}\'.', show_default="unchanged")] = None,
    max_attempts: Annotated[int | None, typer.Option("--max-attempts", min=1, show_default="unchanged")] = None,
    backoff: Annotated[str | None, typer.Option(help="fixed or exponential.", show_default="unchanged")] = None,
    error_delay_ms: MsOpt = None,
    max_delay_ms: MsOpt = None,
    jitter: Annotated[bool | None, typer.Option("--jitter/--no-jitter", show_default="unchanged")] = None,
    lease_ms: MsOpt = None,
    processing_timeout_ms: MsOpt = None,
    retention_ms: MsOpt = None,
    priority_aging_ms: MsOpt = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Change a queue's settings (created if new): what is given changes, the rest stays; prints the queue as JSON."""
    if backoff not in (None, "fixed", "exponential"):
        raise typer.BadParameter("backoff must be fixed or exponential", param_hint="--backoff")
    chosen: Literal["fixed", "exponential"] | None = "fixed" if backoff == "fixed" else "exponential" if backoff else None
    changes: dict[str, Any] = {"concurrency": concurrency, "rate_limit": json_arg(rate_limit, "--rate-limit"), "max_attempts": max_attempts,
                               "backoff": chosen, "error_delay_ms": error_delay_ms, "max_delay_ms": max_delay_ms, "jitter": jitter,
                               "lease_ms": lease_ms, "processing_timeout_ms": processing_timeout_ms, "retention_ms": retention_ms,
                               "priority_aging_ms": priority_aging_ms}
    given = {k: v for k, v in changes.items() if v is not None}
    with InteractionsClient(url, token) as client:
        # PUT replaces every setting: what is not given is sent as the queue has it now.
        current = client.get_queue(queue)
        kept = {k: v for k in QUEUE_SETTINGS if _is_set(v := current.get(k))}
        print_json(client.put_queue(queue, **{**kept, **given}))


QUEUE_SETTINGS = ("rate_limit", "concurrency", "lease_ms", "error_delay_ms", "max_attempts", "processing_timeout_ms", "retention_ms",
                  "backoff", "max_delay_ms", "jitter", "priority_aging_ms", "owner_by", "per_owner", "fair", "weights")
"""What ``PUT /v1/queues/{queue}`` takes (``InteractionsClient.put_queue``'s options)."""


def _is_set(value: Any) -> bool:
    """Whether a queue setting as GET answers it is set (owner settings come as empty tables when unset)."""
    return value is not None and not (isinstance(value, dict) and all(v is None for v in value.values()))


NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The schedule.", show_default=False)]


@schedules_cli.command("list")
def schedules_list_command(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Every cron schedule, with its next tick and where it comes from (app or api)."""
    with InteractionsClient(url, token) as client:
        found = client.list_periodic()
    if as_json:
        print_json(found)
        return
    print_table("schedules", ["name", "cron", "timezone", "queue", "next_tick", "source"], [dict(p) for p in found], ids=("name",))


@schedules_cli.command("put")
def schedules_put_command(
    name: NameArg,
    cron: Annotated[str, typer.Option(help="Five fields, or @hourly and friends.", show_default=False)],
    queue: Annotated[str, typer.Option(help="The queue each tick creates an interaction in.", show_default=False)],
    data: Annotated[str | None, typer.Option(help="The data of every interaction, as JSON.", show_default="null")] = None,
    timezone: Annotated[str | None, typer.Option(help="An IANA time zone.", show_default="UTC")] = None,
    catch_up_ms: Annotated[int | None, typer.Option("--catch-up-ms", min=0, help="Ticks missed while no server ran are created up to this far back.", show_default="3600000")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Create or replace a cron schedule; prints it as JSON."""
    with InteractionsClient(url, token) as client:
        print_json(client.put_periodic(name, cron=cron, queue=queue, data=json_arg(data, "--data"), timezone=timezone, catch_up_ms=catch_up_ms))


@schedules_cli.command("delete")
def schedules_delete_command(name: NameArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Stop a cron schedule (the interactions it created stay)."""
    with InteractionsClient(url, token) as client:
        client.delete_periodic(name)
    out.print(f"{name} deleted", markup=False)
