"""The ``mainspring`` command."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from mainspring import __version__
from mainspring.config import Settings, load_settings
from mainspring.core import alerts as alerts_service
from mainspring.core import auth, outbox
from mainspring.core.logs import configure_logging
from mainspring.core.runtime import retry_while_unavailable
from mainspring.store import Store
from mainspring.store.migrate import migrate as run_migrations

T = TypeVar("T")

cli = typer.Typer(
    name="mainspring",
    help="Mainspring: durable exchange, machines, interactions and batching on one store.",
    no_args_is_help=True,
    rich_markup_mode="rich",
)
token_cli = typer.Typer(help="API tokens (stored as sha256; the token itself is shown once).", no_args_is_help=True)
events_cli = typer.Typer(help="The event log.", no_args_is_help=True)
alerts_cli = typer.Typer(help="Alerts an administrator must see.", no_args_is_help=True)
cli.add_typer(token_cli, name="token")
cli.add_typer(events_cli, name="events")
cli.add_typer(alerts_cli, name="alerts")
console = Console()

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.", envvar="MAINSPRING_CONFIG")]
DatabaseOpt = Annotated[str | None, typer.Option("--database", help="sqlite:///PATH or postgresql://…")]
DataDirOpt = Annotated[Path | None, typer.Option("--data-dir", help="Where SQLite and exchange files live.")]


def settings_from(config: Path | None, database: str | None = None, data_dir: Path | None = None, **server: Any) -> Settings:
    return load_settings(config, server={"database": database, "data_dir": data_dir, **server})


def run_with_store(settings: Settings, work: Callable[[Store], Awaitable[T]], *, migrate: bool = True) -> T:
    async def main() -> T:
        store = Store(settings.server.database_url(), pool_size=2, sqlite_synchronous=settings.server.sqlite_synchronous)
        try:
            if migrate:
                await retry_while_unavailable("migrate", lambda: run_migrations(store), settings.server.startup_wait_ms)
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(main())


@cli.command()
def serve(
    config: ConfigOpt = None,
    host: Annotated[str | None, typer.Option(help="Listen address [default: 127.0.0.1].")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port [default: 8080].")] = None,
    data_dir: DataDirOpt = None,
    database: DatabaseOpt = None,
    app: Annotated[str | None, typer.Option("--app", help="Your code to run in the server, as module:attribute.")] = None,
) -> None:
    """Migrate the store, then serve the HTTP API and run the background work."""
    import uvicorn

    from mainspring.api import create_app
    from mainspring.app import load_app

    settings = settings_from(config, database, data_dir, host=host, port=port)
    configure_logging(settings.server.log_level, settings.server.log_format)
    run_with_store(settings, lambda _store: asyncio.sleep(0))
    registry = load_app(app) if app else None
    server_app = create_app(settings, registry=registry)
    uvicorn.run(
        server_app,
        host=settings.server.host,
        port=settings.server.port,
        log_config=None,
        timeout_graceful_shutdown=max(1, settings.server.graceful_shutdown_ms // 1000),
        ssl_certfile=settings.server.tls_certfile,
        ssl_keyfile=settings.server.tls_keyfile,
        access_log=False,
    )


@cli.command()
def worker(
    app: Annotated[str, typer.Argument(help="Your code, as module:attribute (a mainspring.App).")],
    config: ConfigOpt = None,
    database: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Run the queue handlers of APP against the store, without serving HTTP (SIGTERM: graceful stop)."""
    import sys

    from mainspring.app import load_app
    from mainspring.interactions.worker import run_worker

    settings = settings_from(config, database, data_dir)
    configure_logging(settings.server.log_level, settings.server.log_format)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    registry = load_app(app)
    run_with_store(settings, lambda _store: asyncio.sleep(0))

    async def main() -> None:
        store = Store(settings.server.database_url(), pool_size=settings.server.pool_size, sqlite_synchronous=settings.server.sqlite_synchronous)
        await run_worker(store, registry, settings.interactions, poll_ms=settings.server.poll_interval_ms, graceful_ms=settings.server.graceful_shutdown_ms)

    asyncio.run(main())


@cli.command()
def migrate(config: ConfigOpt = None, database: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """Bring the store's schema up to date (a no-op when it is)."""
    settings = settings_from(config, database, data_dir)
    run_with_store(settings, lambda _store: asyncio.sleep(0))
    console.print(f"[green]schema up to date[/green] ({settings.server.database_url().split('@')[-1]})")


@cli.command()
def version() -> None:
    """Print the version."""
    console.print(__version__)


@token_cli.command("create")
def token_create(
    scope: Annotated[list[str], typer.Option("--scope", "-s", help="A scope such as admin, queues:emails, exchange:send:*.")],
    name: Annotated[str, typer.Option(help="Who the token is for.")] = "token",
    config: ConfigOpt = None,
    database: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Create a token. It is printed once; only its sha256 is stored."""
    settings = settings_from(config, database, data_dir)
    token_id, token = run_with_store(settings, lambda s: auth.create_token(s, name, scope))
    console.print(f"id: {token_id}\ntoken: [bold]{token}[/bold]\n(store it now: it cannot be shown again)")


@token_cli.command("list")
def token_list(config: ConfigOpt = None, database: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """List stored tokens (never the tokens themselves)."""
    settings = settings_from(config, database, data_dir)
    rows = run_with_store(settings, auth.list_tokens)
    table = Table("id", "name", "scopes", "created", "revoked")
    for row in rows:
        table.add_row(row["id"], row["name"], " ".join(row["scopes"]), row["created_at"], row["revoked_at"] or "")
    console.print(table)


@token_cli.command("revoke")
def token_revoke(token_id: str, config: ConfigOpt = None, database: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """Revoke a token by id (every server stops accepting it within auth.cache_ms)."""
    settings = settings_from(config, database, data_dir)
    run_with_store(settings, lambda s: auth.revoke_token(s, token_id))
    console.print(f"revoked {token_id}")


@events_cli.command("tail")
def events_tail(
    after: Annotated[int, typer.Option(help="Start after this event id (0: from the beginning).")] = 0,
    types: Annotated[str | None, typer.Option(help="Comma-separated types, prefix* allowed.")] = None,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", "-f", help="Keep waiting for new events.")] = True,
    config: ConfigOpt = None,
    database: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Print events as JSON lines, oldest first."""
    settings = settings_from(config, database, data_dir)
    wanted = [t for t in (types or "").split(",") if t]

    async def tail(store: Store) -> None:
        position = after
        while True:
            items, position = await outbox.read_events(store, position, 500, wanted)
            for item in items:
                print(json.dumps(item), flush=True)
            if not items:
                if not follow:
                    return
                await asyncio.sleep(settings.server.poll_interval_ms / 1000)

    try:
        run_with_store(settings, tail)
    except KeyboardInterrupt:
        pass


@alerts_cli.command("list")
def alerts_list(
    all_: Annotated[bool, typer.Option("--all", help="Include acknowledged alerts.")] = False,
    config: ConfigOpt = None,
    database: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """List alerts, newest first."""
    settings = settings_from(config, database, data_dir)
    items, _ = run_with_store(settings, lambda s: alerts_service.list_alerts(s, open_only=not all_, limit=1000, cursor=None))
    table = Table("id", "at", "severity", "code", "subject", "detail", "acked")
    for a in items:
        table.add_row(a["id"], a["at"], a["severity"], a["code"], f"{a['subject']['kind']}:{a['subject']['id']}", a["detail"], a["acked_at"] or "")
    console.print(table)


@alerts_cli.command("ack")
def alerts_ack(alert_id: str, config: ConfigOpt = None, database: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """Acknowledge an alert."""
    settings = settings_from(config, database, data_dir)
    run_with_store(settings, lambda s: alerts_service.ack_alert(s, alert_id))
    console.print(f"acknowledged {alert_id}")


def _mount_face_clis() -> None:
    from mainspring.api import FACES

    for face in FACES:
        if face.cli is not None:
            cli.add_typer(face.cli, name=face.name)
    from mainspring.batching.selftest import selftest

    cli.command("selftest")(selftest)


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    _mount_face_clis()
    cli()


if __name__ == "__main__":
    main()
