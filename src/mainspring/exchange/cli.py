"""``mainspring exchange``: mailboxes, processes by state, and resolving IN_DOUBT processes, over a running
server's API (``--url``/``--token``; listing every process and resolving need scope ``admin``)."""

from __future__ import annotations

from typing import Annotated

import typer

from mainspring.client import ExchangeClient
from mainspring.core.cli import (
    DEFAULT_URL,
    CommandGroup,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    print_json,
    print_table,
)
from mainspring.exchange.models import STATES

cli = typer.Typer(help="The exchange of a running server: mailboxes, processes, resolving IN_DOUBT.", no_args_is_help=True, cls=CommandGroup)


@cli.command("mailboxes")
def mailboxes_command(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Mailboxes with their available messages and the process holding each."""
    with ExchangeClient(url, token) as client:
        boxes = client.mailboxes()
    if as_json:
        print_json(boxes)
    else:
        print_table("mailboxes", ["addressee", "database", "available", "active_process_id"], boxes,
                    ids=("addressee", "database", "active_process_id"))


@cli.command("processes")
def processes_command(
    state: Annotated[str | None, typer.Option(help="One of " + ", ".join(STATES) + ".", show_default="any")] = None,
    addressee: Annotated[str | None, typer.Option(help="Only this addressee's mailboxes.", show_default="all (scope admin)")] = None,
    database: Annotated[str | None, typer.Option(help="Only this database's mailbox.", show_default="all")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Processes, oldest first, every page."""
    if state is not None and state not in STATES:
        raise typer.BadParameter(f"state must be one of {', '.join(STATES)}", param_hint="--state")
    with ExchangeClient(url, token) as client:
        found = client.processes(addressee, database, state)
    if as_json:
        print_json(found)
    else:
        print_table("processes", ["id", "addressee", "database", "client_id", "state", "started_at", "deadline"], found)


@cli.command("resolve")
def resolve_command(
    process_id: Annotated[str, typer.Argument(metavar="ID", help="The IN_DOUBT process.", show_default=False)],
    committed: Annotated[bool, typer.Option("--committed/--not-committed", help="Did the client's database commit this process?", show_default=False)],
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Resolve an IN_DOUBT process as API_4 (--committed) or API_5 (--not-committed) would (scope admin)."""
    with ExchangeClient(url, token) as client:
        process = client.resolve(process_id, committed)
    print_json(process)
