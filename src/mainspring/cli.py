"""The ``mainspring`` command.

``serve``, ``migrate``, ``worker`` and ``token`` open the store; everything else talks to a running server
over HTTP (``--url``/``--token``, or ``MAINSPRING_URL``/``MAINSPRING_TOKEN``). Errors are one line and an
exit code (1 refused, 2 bad usage or configuration, 3 server or store unreachable); ``--debug`` shows the
traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from mainspring import __version__
from mainspring.core.cli import (
    DEFAULT_URL,
    EXIT_UNREACHABLE,
    Debug,
    JsonOpt,
    LazyGroup,
    TokenOpt,
    UrlOpt,
    describe,
    out,
    print_json,
    print_table,
    working,
)

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from mainspring.config import Settings
    from mainspring.store import Store

# What a command needs is imported when it runs: `mainspring --version` and the commands that talk to a
# server over HTTP import the client only, not the server (issue 28: 2.4 s for --version before).

T = TypeVar("T")


class MainspringGroup(LazyGroup):
    lazy = {
        "exchange": "mainspring.exchange.cli:cli",
        "machines": "mainspring.machines.cli:cli",
        "machinegun": "mainspring.machines.machinegun.cli:cli",
        "interactions": "mainspring.interactions.cli:cli",
        "batching": "mainspring.batching.cli:cli",
        "workflows": "mainspring.workflows.cli:cli",
        "selftest": "mainspring.batching.selftest:selftest",
    }


cli = typer.Typer(
    name="mainspring",
    help="Mainspring: durable exchange, machines, interactions, batching and workflows on one store.",
    no_args_is_help=True,
    cls=MainspringGroup,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
token_cli = typer.Typer(help="API tokens (stored as sha256; a token itself is shown once). Opens the store.", no_args_is_help=True)
events_cli = typer.Typer(help="The event log of a running server.", no_args_is_help=True)
alerts_cli = typer.Typer(help="Alerts an administrator must see, on a running server.", no_args_is_help=True)
cli.add_typer(token_cli, name="token")
cli.add_typer(events_cli, name="events")
cli.add_typer(alerts_cli, name="alerts")

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file (it must exist).", envvar="MAINSPRING_CONFIG", show_default=False)]
DatabaseOpt = Annotated[str | None, typer.Option("--database", help="sqlite:///PATH or postgresql://…", show_default="sqlite:///<data-dir>/mainspring.db")]
DataDirOpt = Annotated[Path | None, typer.Option("--data-dir", help="Where SQLite and exchange files live.", show_default="./mainspring-data")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mainspring {__version__}")
        raise typer.Exit()


@cli.callback()
def root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True)] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.", envvar="MAINSPRING_DEBUG")] = False,
) -> None:
    """Mainspring: durable exchange, machines, interactions and batching on one store."""
    Debug.enabled = debug


def settings_from(config: Path | None, database: str | None = None, data_dir: Path | None = None, **server: object) -> Settings:
    from mainspring.config import load_settings

    return load_settings(config, server={"database": database, "data_dir": data_dir, **server})


def with_machinegun_config(settings: Settings, path: Path) -> Settings:
    """``settings`` with Machinegun's config.yaml read in: its namespaces beside (and over) the TOML's, its
    ``machinegun`` keys over the TOML's; what it leaves out is logged."""
    from mainspring.config import ConfigError, Settings
    from mainspring.machines.machinegun.config_import import ConfigError as MachinegunConfigError
    from mainspring.machines.machinegun.config_import import read_machinegun_config

    try:
        imported = read_machinegun_config(path)
    except MachinegunConfigError as exc:
        raise ConfigError(exc.detail) from None
    for line in imported.report():
        logging.getLogger("mainspring.machines.machinegun").warning("%s: %s", path, line)
    machines = settings.machines.model_dump()
    machines["namespaces"] = {**machines["namespaces"], **imported.machines["namespaces"]}
    machines["machinegun"] = {**machines["machinegun"], **imported.machines["machinegun"]}
    try:
        return Settings.model_validate({**settings.model_dump(), "machines": machines})
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def existing_store(settings: Settings, hint: str = "pass --database or --data-dir, or create it with `mainspring migrate`") -> None:
    """Refuse to open a SQLite store that does not exist: a command run in the wrong folder must not
    create an empty one beside it."""
    from mainspring.config import ConfigError

    url = settings.server.database_url()
    if url.startswith("sqlite:"):
        path = Path(url.split(":///", 1)[1])
        if not path.exists():
            raise ConfigError(f"no store at {path}: {hint}")


WORKER_STORE_HINT = ("a worker opens the store of `mainspring serve`, by default ./mainspring-data in the folder it runs in: "
                     "run it from the server's folder, or pass --data-dir or --database (or --url to work through the server's API)")


async def _schema_for_worker(store: Store) -> None:
    """A worker needs the schema its code was written for, and migrates only when it is behind (a worker's
    database role need not be allowed DDL when the server migrated first)."""
    from mainspring.store.migrate import migrate as run_migrations
    from mainspring.store.migrate import pending_revisions

    if await pending_revisions(store):
        await run_migrations(store)


def run_with_store(settings: Settings, work: Callable[[Store], Awaitable[T]], *, migrate: bool = True, waiting: str = "migrate") -> T:
    """``work`` on the store, once it is reachable (``waiting`` names what waits in the log) and migrated."""
    import asyncio

    from mainspring.core.errors import StoreRefused, StoreUnreachable
    from mainspring.core.runtime import retry_while_unavailable
    from mainspring.store import Store
    from mainspring.store.errors import is_unavailable, refusal
    from mainspring.store.migrate import migrate as run_migrations

    async def main() -> T:
        store = Store(settings.server.database_url(), pool_size=2, sqlite_synchronous=settings.server.sqlite_synchronous)
        where = settings.server.database_url().split("@")[-1]
        try:
            if migrate:
                await retry_while_unavailable(waiting, lambda: run_migrations(store), settings.server.startup_wait_ms)
                return await work(store)
            return await retry_while_unavailable(waiting, lambda: work(store), settings.server.startup_wait_ms)
        except Exception as exc:
            refused = refusal(exc)
            if refused is not None:
                raise StoreRefused(f"the store at {where} refused the connection: {refused}") from exc
            if is_unavailable(exc):
                raise StoreUnreachable(f"the store at {where} did not answer within {settings.server.startup_wait_ms / 1000:g} s "
                                       f"(server.startup_wait_ms): {describe(exc)}") from exc
            raise
        finally:
            await store.close()

    return asyncio.run(main())


async def _noop(_store: Store) -> None:
    """Nothing: ``run_with_store(settings, _noop)`` only migrates."""


WORKER_HEALTHCHECK_S = 60


@cli.command()
def serve(
    config: ConfigOpt = None,
    host: Annotated[str | None, typer.Option(help="Listen address.", show_default="127.0.0.1")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port.", show_default="8080")] = None,
    data_dir: DataDirOpt = None,
    database: DatabaseOpt = None,
    app: Annotated[str | None, typer.Option("--app", help="Your code to run in the server, as module:attribute.", show_default=False)] = None,
    workers: Annotated[int, typer.Option(min=1, help="Server processes on the one port (PostgreSQL only).")] = 1,
    machinegun_config: Annotated[Path | None, typer.Option("--machinegun-config", help="Machinegun's config.yaml: its namespaces, sinks and listener (docs/machinegun.md).", show_default=False)] = None,
) -> None:
    """Migrate the store (creating it if new), then serve the HTTP API, the dashboard and the background work."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from mainspring.api import SERVE_APP_ENV, SERVE_SETTINGS_ENV, create_app
    from mainspring.app import load_app
    from mainspring.config import check_installed
    from mainspring.core.logs import configure_logging
    from mainspring.core.runtime import bind_address
    from mainspring.web import transport

    settings = settings_from(config, database, data_dir, host=host, port=port)
    configure_logging(settings.server.log_level, settings.server.log_format, access_log=settings.server.access_log)
    if machinegun_config is not None:
        settings = with_machinegun_config(settings, machinegun_config)
    if workers > 1 and not settings.server.database_url().startswith("postgresql"):
        raise typer.BadParameter("several workers need PostgreSQL: SQLite has one writer, so more processes add only contention", param_hint="--workers")
    check_installed(settings)
    registry = load_app(app) if app else None
    # Bind first: a taken port must fail the start before a store is created or recovery runs (on a shared
    # PostgreSQL, recovery turns live commits of the server that holds the port IN_DOUBT).
    main_socket = bind_address(settings.server.host, settings.server.port)
    listener_socket = None
    if settings.machines.machinegun.listen is not None:
        from mainspring.machines.machinegun.listener import bind_listener

        listener_socket = bind_listener(settings, shared=workers > 1)
    if listener_socket is not None and workers > 1:
        # Each process binds the listener itself (SO_REUSEPORT); this socket only proved the address is free.
        listener_socket.close()
    run_with_store(settings, _noop)
    if workers > 1:
        # Each worker process builds its own server from the same settings (uvicorn imports the factory there).
        os.environ[SERVE_SETTINGS_ENV] = settings.model_dump_json()
        if app:
            os.environ[SERVE_APP_ENV] = app
    server_app: str | Starlette = "mainspring.api:serve_app"
    if workers == 1:
        server_app = create_app(settings, registry=registry, own_process=True)
        if listener_socket is not None:
            from mainspring.machines.machinegun.listener import LISTENER_SOCKET

            server_app.state.context.extras[LISTENER_SOCKET] = listener_socket
    server_config = transport.uvicorn_config(
        server_app,
        settings.server,
        factory=workers > 1,
        workers=workers,
        host=settings.server.host,
        port=settings.server.port,
        timeout_graceful_shutdown=max(1, settings.server.graceful_shutdown_ms // 1000),
        # uvicorn kills a worker that misses one 5 s health ping; a worker still importing or recovering on a
        # loaded machine missed it and was killed before it ever served (seen in the two-worker test).
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
        ssl_certfile=settings.server.tls_certfile,
        ssl_keyfile=settings.server.tls_keyfile,
    )
    # What uvicorn.run does, on the socket bound above.
    if workers > 1:
        Multiprocess(server_config, sockets=[main_socket]).run()
        return
    server = uvicorn.Server(server_config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[main_socket])
    if not server.started:
        raise typer.Exit(EXIT_UNREACHABLE)


@cli.command()
def worker(
    app: Annotated[str, typer.Argument(help="Your code, as module:attribute (a mainspring.App).", show_default=False)],
    config: ConfigOpt = None,
    database: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
    url: Annotated[str | None, typer.Option("--url", help="Work through this server's HTTP API instead of the store (no database credentials needed).", show_default="the store")] = None,
    token: TokenOpt = None,
    http_port: Annotated[int | None, typer.Option("--http-port", help="Serve /healthz and /metrics on this port.", show_default="off")] = None,
    http_host: Annotated[str, typer.Option("--http-host", help="Address of the /healthz and /metrics port.")] = "127.0.0.1",
) -> None:
    """Run APP's queue handlers and batch workers without serving the API: on the store of `mainspring serve` (the same defaults: ./mainspring-data in the current folder), or with --url through a server's HTTP API. Its machine processors run in the server. SIGTERM: graceful stop; a second signal: at once."""
    from mainspring.app import load_app
    from mainspring.client.errors import check_url
    from mainspring.core.logs import configure_logging
    from mainspring.worker import Remote, run, runnable

    if url is not None and (database is not None or data_dir is not None):
        raise typer.BadParameter("a worker with --url works through the server's API: it opens no store (no --database or --data-dir)", param_hint="--url")
    settings = settings_from(config, database, data_dir)
    configure_logging(settings.server.log_level, settings.server.log_format)
    registry = load_app(app)
    what = runnable(registry)
    remote = None
    if url is not None:
        remote = Remote(check_url(url), token)
    else:
        existing_store(settings, WORKER_STORE_HINT)
        run_with_store(settings, _schema_for_worker, migrate=False, waiting="waiting for the store")
    out.print(f"mainspring worker runs {what}{f' through {url}' if url else ''}", markup=False)
    import asyncio

    asyncio.run(run(settings, registry, http_host=http_host, http_port=http_port, remote=remote, own_process=True))


@cli.command()
def migrate(config: ConfigOpt = None, database: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """Create the store, or bring its schema up to date (a no-op when it is)."""
    settings = settings_from(config, database, data_dir)
    with working("migrating the store…"):
        run_with_store(settings, _noop)
    out.print(f"[green]schema up to date[/green] ({settings.server.database_url().split('@')[-1]})")


@cli.command()
def version() -> None:
    """Print the version (as --version does)."""
    typer.echo(f"mainspring {__version__}")


@token_cli.command("create")
def token_create(
    scope: Annotated[list[str], typer.Option("--scope", "-s", help="A scope such as admin, ui, queues:emails, exchange:send:*.", show_default=False)],
    name: Annotated[str, typer.Option(help="Who the token is for.")] = "token",
    config: ConfigOpt = None,
    database: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Create a token. It is printed once; only its sha256 is stored."""
    from mainspring.core import auth

    settings = settings_from(config, database, data_dir)
    existing_store(settings)

    async def create(store: Store) -> tuple[bool, str, str]:
        was_open = await auth.server_state(store, settings.auth) == "open"
        return (was_open, *await auth.create_token(store, name, scope))

    was_open, token_id, token = run_with_store(settings, create)
    out.print(f"id: {token_id}\ntoken: [bold]{token}[/bold]\n(store it now: it cannot be shown again)")
    if was_open:
        # The first token turns an open server into a closed one; nobody should learn it from a 401.
        out.print(f"[bold yellow]The server is no longer open:[/bold yellow] this is its first token, so within "
                  f"auth.cache_ms ({settings.auth.cache_ms} ms) every server on this store refuses any request without a "
                  "token — the dashboard, workers with --url and CLI commands included. Give each of them a token; "
                  "revoking this one later does not open the server again.")


@token_cli.command("list")
def token_list(config: ConfigOpt = None, database: DatabaseOpt = None, data_dir: DataDirOpt = None, as_json: JsonOpt = False) -> None:
    """List stored tokens (never the tokens themselves)."""
    from mainspring.core import auth

    settings = settings_from(config, database, data_dir)
    existing_store(settings)
    rows = run_with_store(settings, auth.list_tokens)
    if as_json:
        print_json(rows)
        return
    print_table("tokens", ["id", "name", "scopes", "created_at", "revoked_at"],
                [{**r, "scopes": " ".join(r["scopes"])} for r in rows])


@token_cli.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(metavar="ID", help="The token's id (from token list).", show_default=False)],
    config: ConfigOpt = None,
    database: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Revoke a token by id (every server stops accepting it within auth.cache_ms)."""
    from mainspring.core import auth

    settings = settings_from(config, database, data_dir)
    existing_store(settings)

    async def revoke(store: Store) -> str:
        await auth.revoke_token(store, token_id)
        return await auth.server_state(store, settings.auth)

    state = run_with_store(settings, revoke)
    out.print(f"revoked {token_id}")
    if state == "open":
        out.print("[bold yellow]No token is left and auth.open_when_all_revoked is set: the server is OPEN to "
                  "anyone who can reach it.[/bold yellow]")
    elif state == "locked":
        out.print("[bold yellow]No active token is left: the server stays closed and refuses every request[/bold yellow] "
                  "until a token is created (or auth.open_when_all_revoked is set).")


@events_cli.command("tail")
def events_tail(
    after: Annotated[str | None, typer.Option(help="Start after this event id.", show_default="from the beginning")] = None,
    types: Annotated[str | None, typer.Option(help="Comma-separated types, prefix* allowed.", show_default="all")] = None,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", "-f", help="Keep waiting for new events.")] = True,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Print events as JSON lines, oldest first (scope admin or ui)."""
    from mainspring.client.events import EventsClient

    try:
        with EventsClient(url, token) as client:
            for event in client.follow(after, types, forever=follow):
                typer.echo(json.dumps(event), nl=True)
    except KeyboardInterrupt:
        pass


@alerts_cli.command("list")
def alerts_list(
    all_: Annotated[bool, typer.Option("--all", help="Include acknowledged alerts.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List alerts, newest first."""
    from mainspring.client.events import EventsClient

    with EventsClient(url, token) as client:
        items = list(client.iterate_alerts(open_only=not all_))
    if as_json:
        print_json(items)
        return
    print_table("alerts", ["id", "at", "severity", "code", "subject", "detail", "acked_at"],
                [{**a, "subject": f"{a['subject']['kind']}:{a['subject']['id']}"} for a in items], ids=("id", "subject"))


@alerts_cli.command("ack")
def alerts_ack(
    alert_id: Annotated[str, typer.Argument(metavar="ID", help="The alert's id (from alerts list).", show_default=False)],
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Acknowledge an alert (scope admin)."""
    from mainspring.client.events import EventsClient

    with EventsClient(url, token) as client:
        client.ack_alert(alert_id)
    out.print(f"acknowledged {alert_id}", markup=False)


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    cli()


if __name__ == "__main__":
    main()
