"""``mainspring machines``: list, show and repair machines of a running server, over its HTTP API.

Unlike ``mainspring exchange`` this needs a server: a repair runs the namespace's processor, which only a
server (or the user's own service) can call. Exit status 1 with the problem's ``code`` when the server refuses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from mainspring.client.machines import MachinesClient, MachinesError

T = TypeVar("T")

cli = typer.Typer(help="Machines of a running server: list, show, repair.", no_args_is_help=True)

UrlOpt = Annotated[str, typer.Option(help="The server.", envvar="MAINSPRING_URL")]
TokenOpt = Annotated[str | None, typer.Option(help="Bearer token with scope machines:<ns>.", envvar="MAINSPRING_TOKEN")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
DEFAULT_URL = "http://127.0.0.1:8080"


def _with_client(url: str, token: str | None, work: Callable[[MachinesClient], T]) -> T:
    try:
        with MachinesClient(url, token) as client:
            return work(client)
    except MachinesError as error:
        typer.echo(f"refused ({error.status} {error.problem.get('code')}): {error.problem.get('detail', '')}", err=True)
        raise typer.Exit(1) from error


def _json_arg(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}") from exc


@cli.command("list")
def list_command(
    ns: Annotated[str, typer.Argument(help="The namespace.")],
    status: Annotated[str | None, typer.Option(help="working or failed.")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Every machine of a namespace (all pages), optionally only the failed or working ones."""
    found = _with_client(url, token, lambda client: list(client.list(ns, status=status)))
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    table = Table(title=f"machines of {ns}")
    for column in ("id", "status", "timer", "updated_at"):
        table.add_column(column)
    for machine in found:
        table.add_row(*[str(machine.get(c) or "") for c in ("id", "status", "timer", "updated_at")])
    Console().print(table)


@cli.command("show")
def show_command(
    ns: Annotated[str, typer.Argument(help="The namespace.")],
    machine_id: Annotated[str, typer.Argument(metavar="ID", help="The machine.")],
    last: Annotated[int, typer.Option(min=1, max=1000, help="How many of the latest events to show.")] = 20,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """A machine: status, aux state, timer, its latest events and, when failed, why (JSON)."""
    machine = _with_client(url, token, lambda client: client.get(ns, machine_id, limit=last, direction="backward"))
    typer.echo(json.dumps(machine, indent=2))


@cli.command("repair")
def repair_command(
    ns: Annotated[str, typer.Argument(help="The namespace.")],
    machine_id: Annotated[str, typer.Argument(metavar="ID", help="The machine.")],
    args: Annotated[str | None, typer.Option(help="JSON arguments for the processor's repair.")] = None,
    simple: Annotated[bool, typer.Option("--simple", help="Make it work again without calling the processor.")] = False,
    key: Annotated[str | None, typer.Option(help="Idempotency-Key, so a retried repair is applied once.")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Repair a failed machine (through its processor, or --simple); prints the processor's response."""
    value = _json_arg(args)
    response = _with_client(url, token, lambda client: client.repair(ns, machine_id, value, simple=simple, idempotency_key=key))
    typer.echo(json.dumps(response, indent=2))
