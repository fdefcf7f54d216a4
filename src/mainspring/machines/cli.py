"""``mainspring machines``: list, show and repair machines of a running server, over its HTTP API
(``--url``/``--token`` with scope ``machines:<ns>``). A repair runs the namespace's processor, which only
a server (or the user's own service) can call."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from mainspring.client.machines import MachinesClient
from mainspring.core.cli import (
    DEFAULT_URL,
    CommandGroup,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    json_arg,
    out,
    print_json,
    print_table,
)

cli = typer.Typer(help="Machines of a running server: list, show, start, call, notify, repair.", no_args_is_help=True, cls=CommandGroup)

NsArg = Annotated[str, typer.Argument(metavar="NS", help="The namespace.", show_default=False)]
IdArg = Annotated[str, typer.Argument(metavar="ID", help="The machine.", show_default=False)]


@cli.command("list")
def list_command(
    ns: NsArg,
    status: Annotated[str | None, typer.Option(help="working or failed.", show_default="both")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Every machine of a namespace (all pages), optionally only the failed or working ones."""
    if status not in (None, "working", "failed"):
        raise typer.BadParameter("status must be working or failed", param_hint="--status")
    wanted: Literal["working", "failed"] | None = "failed" if status == "failed" else "working" if status else None
    with MachinesClient(url, token) as client:
        found = list(client.list(ns, status=wanted))
    if as_json:
        print_json(found)
        return
    print_table(f"machines of {ns}", ["id", "status", "timer", "updated_at"], [dict(m) for m in found])


@cli.command("show")
def show_command(
    ns: NsArg,
    machine_id: IdArg,
    last: Annotated[int, typer.Option(min=1, max=1000, help="How many of the latest events to show.")] = 20,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """A machine as JSON: status, aux state, timer, its latest events and, when failed, why."""
    with MachinesClient(url, token) as client:
        print_json(client.get(ns, machine_id, limit=last, direction="backward"))


@cli.command("repair")
def repair_command(
    ns: NsArg,
    machine_id: IdArg,
    args: Annotated[str | None, typer.Option(help="JSON arguments for the processor's repair.", show_default="null")] = None,
    simple: Annotated[bool, typer.Option("--simple", help="Make it work again without calling the processor.")] = False,
    key: Annotated[str | None, typer.Option(help="Idempotency-Key, so a retried repair is applied once.", show_default=False)] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Repair a failed machine (through its processor, or --simple); prints the processor's response, or with
    --simple (there is no response) the machine's status."""
    value = json_arg(args, "--args")
    with MachinesClient(url, token) as client:
        response = client.repair(ns, machine_id, value, simple=simple, idempotency_key=key)
        if not simple:
            print_json(response)
            return
        status = client.get(ns, machine_id, limit=1)["status"]
    out.print(f"{machine_id} {status} (repaired without calling the processor)", markup=False)


ArgsOpt = Annotated[str | None, typer.Option(help="JSON arguments for the processor.", show_default="null")]
KeyOpt = Annotated[str | None, typer.Option(help="Idempotency-Key, so a retried command is applied once.", show_default=False)]


@cli.command("start")
def start_command(ns: NsArg, machine_id: IdArg, args: ArgsOpt = None, key: KeyOpt = None,
                  url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Start a machine (the processor's init); prints it as JSON."""
    with MachinesClient(url, token) as client:
        print_json(client.start(ns, machine_id, json_arg(args, "--args"), idempotency_key=key))


@cli.command("call")
def call_command(ns: NsArg, machine_id: IdArg, args: ArgsOpt = None, key: KeyOpt = None,
                 timeout_ms: Annotated[int | None, typer.Option("--timeout-ms", min=1, help="How long the processor may take.", show_default="the namespace's")] = None,
                 url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Call a machine (the processor's call); prints the processor's response as JSON."""
    with MachinesClient(url, token) as client:
        print_json(client.call(ns, machine_id, json_arg(args, "--args"), idempotency_key=key, timeout_ms=timeout_ms))


@cli.command("notify")
def notify_command(ns: NsArg, machine_id: IdArg, args: ArgsOpt = None, key: KeyOpt = None,
                   url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Queue a notification for a machine (delivered later, in order); prints its id."""
    with MachinesClient(url, token) as client:
        out.print(client.notify(ns, machine_id, json_arg(args, "--args"), idempotency_key=key), markup=False)
