"""``mainspring batching``: batcher settings, tasks and packages of a running server, over its HTTP API
(``--url``/``--token`` with scope ``batchers:<name>``); ``mainspring selftest`` runs end-to-end scenarios."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from mainspring.batching.selftest import selftest
from mainspring.client.batching import BatchingClient
from mainspring.client.models import Package
from mainspring.core.cli import DEFAULT_URL, CommandGroup, JsonOpt, TokenOpt, UrlOpt, print_json, print_table

cli = typer.Typer(help="Batchers of a running server: settings, tasks, packages, selftest.", no_args_is_help=True, cls=CommandGroup)

NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The batcher.", show_default=False)]


@cli.command("settings")
def settings_command(
    name: NameArg,
    min_size: Annotated[int | None, typer.Option("--min-size", min=1, help="Start the linger timer at this many pending tasks.", show_default="unchanged")] = None,
    max_size: Annotated[int | None, typer.Option("--max-size", min=1, help="Pack at once at this many.", show_default="unchanged")] = None,
    linger_ms: Annotated[int | None, typer.Option("--linger-ms", min=0, show_default="unchanged")] = None,
    max_wait_ms: Annotated[int | None, typer.Option("--max-wait-ms", min=0, show_default="unchanged")] = None,
    group_size: Annotated[int | None, typer.Option("--group-size", min=1, show_default="unchanged")] = None,
    incomplete_group: Annotated[str | None, typer.Option("--incomplete-group", help="reject or carry.", show_default="unchanged")] = None,
    lease_ms: Annotated[int | None, typer.Option("--lease-ms", min=1, show_default="unchanged")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Show a batcher's settings and counts as JSON; with options, change them first."""
    if incomplete_group not in (None, "reject", "carry"):
        raise typer.BadParameter("reject or carry", param_hint="--incomplete-group")
    mode: Literal["reject", "carry"] | None = "carry" if incomplete_group == "carry" else "reject" if incomplete_group else None
    changes = (min_size, max_size, linger_ms, max_wait_ms, group_size, mode, lease_ms)
    with BatchingClient(url, token) as client:
        if any(v is not None for v in changes):
            client.put_batcher(name, min_size=min_size, max_size=max_size, linger_ms=linger_ms, max_wait_ms=max_wait_ms,
                               group_size=group_size, incomplete_group=mode, lease_ms=lease_ms)
        print_json(client.get_batcher(name))


@cli.command("tasks")
def tasks_command(
    name: NameArg,
    task_ids: Annotated[list[str], typer.Argument(metavar="TASK_ID...", help="One or more task ids.", show_default=False)],
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Where tasks are: status, version, package, and why (reason, error)."""
    with BatchingClient(url, token) as client:
        found = [client.task(name, task_id) for task_id in task_ids]
    if as_json:
        print_json(found)
    else:
        print_table(f"tasks of {name}", ["id", "group", "member", "version", "status", "reason", "package_id", "error"],
                    [dict(t) for t in found], ids=("id", "package_id"))


@cli.command("packages")
def packages_command(
    name: NameArg,
    status: Annotated[str | None, typer.Option(help="ready, claimed, done or failed.", show_default="all")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A batcher's packages, oldest first, every page."""
    if status not in (None, "ready", "claimed", "done", "failed"):
        raise typer.BadParameter("ready, claimed, done or failed", param_hint="--status")
    wanted: Literal["ready", "claimed", "done", "failed"] | None = status  # type: ignore[assignment]
    with BatchingClient(url, token) as client:
        found = list(client.iterate_packages(name, wanted))
    if as_json:
        print_json(found)
    else:
        rows = [{**p, "tasks": len(p["tasks"]), "lease": _expires(p)} for p in found]
        print_table(f"packages of {name}", ["id", "status", "attempts", "tasks", "worker", "lease", "created_at"], rows)


def _expires(package: Package) -> str | None:
    lease = package.get("lease")
    return lease["expires_at"] if lease else None


cli.command("selftest")(selftest)
