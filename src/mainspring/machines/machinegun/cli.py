"""``mainspring machinegun``: moving from Machinegun."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mainspring.core.cli import CommandGroup

cli = typer.Typer(help="Coming from Machinegun: its config.yaml as Mainspring settings.", no_args_is_help=True, cls=CommandGroup)


@cli.command("import-config")
def import_config(
    config: Annotated[Path, typer.Argument(metavar="CONFIG_YAML", help="Machinegun's config.yaml.", show_default=False)],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the TOML here.", show_default="print it")] = None,
) -> None:
    """Machinegun's config.yaml as Mainspring's TOML ([machines]: namespaces, retries, event sinks, Modernizer,
    the listener); every key left out is listed with why, on stderr and in the file's comments."""
    from mainspring.machines.machinegun.config_import import ConfigError, read_machinegun_config, to_toml

    try:
        imported = read_machinegun_config(config)
    except ConfigError as exc:
        typer.echo(f"error: {exc.detail}", err=True)
        raise typer.Exit(2) from None
    text = to_toml(imported)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
    for line in imported.report():
        typer.echo(line, err=True)
