"""``mainspring exchange``: mailboxes, processes by state, and resolving IN_DOUBT processes.

It works on the store and the data dir directly (like ``mainspring token``), so it also works while no
server runs; what it changes is exactly what the HTTP API would change.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from mainspring.core.errors import MainspringError
from mainspring.core.runtime import Context
from mainspring.exchange import messages, service
from mainspring.exchange.models import STATES
from mainspring.exchange.settings import ExchangeSettings
from mainspring.store import Store

T = TypeVar("T")

cli = typer.Typer(help="The exchange: mailboxes, processes, resolving IN_DOUBT.", no_args_is_help=True)

DataDirOpt = Annotated[Path, typer.Option("--data-dir", envvar="MAINSPRING_SERVER__DATA_DIR",
                                          help="The server's data dir (message files live under exchange/).")]
DatabaseOpt = Annotated[str | None, typer.Option("--database", envvar="MAINSPRING_SERVER__DATABASE",
                                                 help="sqlite:///PATH or postgresql://… [default: the data dir's SQLite]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _run(data_dir: Path, database: str | None, work: Callable[[Context], Awaitable[T]]) -> T:
    url = database or f"sqlite:///{(data_dir / 'mainspring.db').resolve()}"

    async def main() -> T:
        store = Store(url, pool_size=2)
        settings = SimpleNamespace(server=SimpleNamespace(data_dir=data_dir, poll_interval_ms=1000),
                                   exchange=ExchangeSettings(backup=os.environ.get("MAINSPRING_EXCHANGE__BACKUP", "").lower() in ("1", "true")))
        try:
            return await work(Context(settings=settings, store=store))
        finally:
            await store.close()

    return asyncio.run(main())


def _table(title: str, columns: list[str], rows: list[dict[str, Any]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*[str(row.get(c) if row.get(c) is not None else "") for c in columns])
    Console().print(table)


@cli.command("mailboxes")
def mailboxes_command(data_dir: DataDirOpt = Path("./mainspring-data"), database: DatabaseOpt = None,
                      as_json: JsonOpt = False) -> None:
    """Mailboxes with their available messages and the process holding each."""
    boxes = _run(data_dir, database, messages.list_mailboxes)
    if as_json:
        typer.echo(json.dumps(boxes, indent=2))
    else:
        _table("mailboxes", ["addressee", "database", "available", "active_process_id"], boxes)


@cli.command("processes")
def processes_command(
    state: Annotated[str | None, typer.Option(help="One of " + ", ".join(STATES) + ".")] = None,
    addressee: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    data_dir: DataDirOpt = Path("./mainspring-data"),
    database: DatabaseOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Processes, oldest first, by state."""
    if state is not None and state not in STATES:
        raise typer.BadParameter(f"state must be one of {', '.join(STATES)}")
    page = _run(data_dir, database, lambda ctx: service.list_processes(
        ctx, state=state, addressee=addressee, database=None, limit=limit, cursor=None))
    if as_json:
        typer.echo(json.dumps(page["processes"], indent=2))
    else:
        _table("processes", ["id", "addressee", "database", "client_id", "state", "started_at", "deadline"],
               page["processes"])


@cli.command("resolve")
def resolve_command(
    process_id: str,
    committed: Annotated[bool, typer.Option("--committed/--not-committed",
                                            help="Did the client's database commit this process?")],
    data_dir: DataDirOpt = Path("./mainspring-data"),
    database: DatabaseOpt = None,
) -> None:
    """Resolve an IN_DOUBT process as API_4 (--committed) or API_5 (--not-committed) would."""
    try:
        process = _run(data_dir, database, lambda ctx: service.resolve(ctx, process_id, committed))
    except MainspringError as exc:
        typer.echo(f"{exc.code}: {exc.detail}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(process, indent=2))
