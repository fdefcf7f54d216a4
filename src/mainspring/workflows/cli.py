"""``mainspring workflows``: list, show, start, signal, cancel and retry runs of a running server, over its HTTP
API (``--url``/``--token`` with scope ``workflows:<name>``)."""

from __future__ import annotations

from typing import Annotated

import typer

from mainspring.client import WorkflowsClient
from mainspring.core.cli import (
    DEFAULT_URL,
    CommandGroup,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    json_arg,
    print_json,
    print_table,
)

cli = typer.Typer(help="Workflow runs of a running server: list, show, start, signal, cancel, retry.", no_args_is_help=True, cls=CommandGroup)

NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The workflow.", show_default=False)]
IdArg = Annotated[str, typer.Argument(metavar="ID", help="The run.", show_default=False)]
STATUSES = ("running", "sleeping", "waiting", "completed", "failed", "cancelled")


@cli.command("list")
def list_command(
    name: Annotated[str | None, typer.Argument(metavar="[NAME]", help="The workflow (none: every workflow, counted).", show_default=False)] = None,
    status: Annotated[str | None, typer.Option(help=f"Only runs that are {', '.join(STATUSES)}.", show_default="all")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The runs of a workflow (all pages), or every workflow with its runs counted by status."""
    if status not in (None, *STATUSES):
        raise typer.BadParameter(f"status must be one of {', '.join(STATUSES)}", param_hint="--status")
    with WorkflowsClient(url, token) as client:
        if name is None:
            found = client.workflows()
            if as_json:
                print_json(found)
                return
            print_table("workflows", ["name", *STATUSES], [{"name": w["name"], **w["counts"]} for w in found], ids=("name",))
            return
        runs = list(client.list(name, status=status))
    if as_json:
        print_json(runs)
        return
    print_table(f"runs of {name}", ["id", "status", "waiting_for", "updated_at"], [dict(r) for r in runs])


@cli.command("show")
def show_command(name: NameArg, run_id: IdArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """A run as JSON: status, args, result or error, what it waits for, and its steps."""
    with WorkflowsClient(url, token) as client:
        print_json(client.get(name, run_id))


@cli.command("start")
def start_command(
    name: NameArg,
    args: Annotated[str | None, typer.Option(help="The run's JSON args.", show_default="null")] = None,
    run_id: Annotated[str | None, typer.Option("--id", help="The run's id (start is idempotent by it).", show_default="a new uuid")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the run to finish and print its result.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Start a run (or answer the existing one with this --id); prints it, or with --wait its result."""
    value = json_arg(args, "--args")
    with WorkflowsClient(url, token) as client:
        run = client.start(name, value, id=run_id)
        print_json(client.result(name, run["id"]) if wait else run)


@cli.command("signal")
def signal_command(
    name: NameArg,
    run_id: IdArg,
    signal: Annotated[str, typer.Argument(metavar="SIGNAL", help="The signal's name.", show_default=False)],
    payload: Annotated[str | None, typer.Option(help="The signal's JSON payload.", show_default="null")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Send a signal to a run (kept, in order, until a wait takes it)."""
    value = json_arg(payload, "--payload")
    with WorkflowsClient(url, token) as client:
        client.signal(name, run_id, signal, value)


@cli.command("cancel")
def cancel_command(name: NameArg, run_id: IdArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Cancel a run (its code gets CancelledError at its current await; its tasks and children are cancelled)."""
    with WorkflowsClient(url, token) as client:
        print_json(client.cancel(name, run_id))


@cli.command("retry")
def retry_command(name: NameArg, run_id: IdArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Resume a failed run from its records."""
    with WorkflowsClient(url, token) as client:
        print_json(client.retry(name, run_id))
