"""What every ``mainspring`` command shares: the connection to a server, output for people and for
scripts, progress on long work, and errors as one line with an exit code.

Commands that inspect or change live state talk to a running server over HTTP (``--url``/``--token``, or
``MAINSPRING_URL``/``MAINSPRING_TOKEN``); only ``serve``, ``migrate``, ``worker`` and ``token`` open the
store themselves.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Annotated, Any, cast

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from typer.core import TyperGroup

from mainspring.core.errors import MainspringError
from mainspring.types import JsonData

DEFAULT_URL = "http://127.0.0.1:8080"

UrlOpt = Annotated[str, typer.Option("--url", help="The server.", envvar="MAINSPRING_URL", show_default=True)]
TokenOpt = Annotated[str | None, typer.Option("--token", help="Bearer token (when the server has tokens).", envvar="MAINSPRING_TOKEN", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (an array for lists) instead of a table.")]

EXIT_REFUSED = 1
"""The server (or the store) refused: the problem's code is printed."""
EXIT_USAGE = 2
"""Bad arguments or configuration (click's own code for usage errors)."""
EXIT_UNREACHABLE = 3
"""The server or the store could not be reached."""

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class Debug:
    """``mainspring --debug``: show tracebacks instead of one-line errors."""

    enabled = False


def json_arg(value: str | None, name: str = "value") -> JsonData:
    """A JSON option's value (None stays None)."""
    if value is None:
        return None
    try:
        return cast(JsonData, json.loads(value))
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint=name) from exc


def print_json(value: object) -> None:
    """JSON for scripts, indented, whatever the terminal."""
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False))


def print_table(title: str, columns: Sequence[str], rows: Iterable[Mapping[str, object]], *, ids: Sequence[str] = ("id",)) -> None:
    """Rows for people, or for scripts when the output is not a terminal.

    On a terminal: one line per row when the table fits its width (times without their milliseconds,
    columns empty in every row left out);
    otherwise each row as a block of ``column  value`` lines, long values folded (as psql's expanded
    display does), so no cell is ever cut into one character per line. Piped: plain columns, a header line
    and one line per row, nothing cut or folded, separated by two spaces. The ``ids`` columns are never
    cut either way: the next command needs them whole."""
    materialized = [{c: _cell(r.get(c)) for c in columns} for r in rows]
    if not out.is_terminal:
        _print_plain(columns, materialized)
        return
    # A column empty in every row says nothing to a person (scripts, above, keep every column).
    columns = [c for c in columns if c in ids or any(r[c] for r in materialized)]
    shown = [{c: _short_time(r[c]) if _is_time(c) else r[c] for c in columns} for r in materialized]
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for column in columns:
        table.add_column(column, no_wrap=True, overflow="ignore" if column in ids else "ellipsis")
    for row in shown:
        table.add_row(*row.values())
    if Measurement.get(out, out.options.update(max_width=UNBOUNDED), table).maximum <= out.width:
        out.print(table)
        return
    out.print(f"{title} ({len(shown)})", markup=False, style="bold")
    for number, row in enumerate(shown, 1):
        record = Table.grid(padding=(0, 2))
        record.add_column(style="dim", no_wrap=True)
        record.add_column(overflow="fold")
        for column, value in row.items():
            record.add_row(column, value)
        out.print(f"── {number} " + "─" * max(0, min(out.width, 40) - len(str(number)) - 4), style="dim", markup=False)
        out.print(record)


UNBOUNDED = 100_000
"""A width no table reaches: its natural width is measured against it."""


def _print_plain(columns: Sequence[str], rows: list[dict[str, str]]) -> None:
    widths = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in columns}
    for line in [dict(zip(columns, columns, strict=True)), *rows]:
        out.file.write("  ".join(line[c].ljust(widths[c]) for c in columns).rstrip() + "\n")


def _is_time(column: str) -> bool:
    return column in ("at", "deadline", "next_processing") or column.endswith("_at")


def _short_time(value: str) -> str:
    """``2026-11-26T09:00:00.123Z`` as ``2026-11-26 09:00:00`` (UTC, as every time the API writes)."""
    return value[:19].replace("T", " ") if len(value) >= 19 and value[10:11] == "T" else value


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


@contextlib.contextmanager
def working(message: str) -> Iterator[None]:
    """A spinner while the block runs, on a terminal; one plain line on stderr when piped."""
    if err.is_terminal:
        with err.status(message):
            yield
    else:
        err.print(message, markup=False)
        yield


def exit_code_of(exc: BaseException) -> int:
    """The exit status for an error a command let through."""
    status = getattr(exc, "status", None)
    if isinstance(exc, MainspringError) and (status == 503 or exc.code in ("unreachable", "no_answer")):
        return EXIT_UNREACHABLE
    if isinstance(exc, MainspringError) and exc.code in ("invalid_config", "invalid_url", "invalid_app", "no_mainspring_api"):
        return EXIT_USAGE
    if isinstance(exc, MainspringError):
        return EXIT_REFUSED
    if isinstance(exc, ConnectionError | TimeoutError):
        return EXIT_UNREACHABLE
    return EXIT_REFUSED


def describe(exc: BaseException) -> str:
    """One line for an error: the problem's code and detail, or the exception's type and message."""
    if isinstance(exc, MainspringError):
        return f"{exc.code}: {exc.detail}"
    extra = {"asyncpg": "postgres", "nats": "nats", "aiokafka": "kafka"}
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in extra:
        return f"{exc.name} is not installed: pip install 'mainspring[{extra[(exc.name or '').split('.')[0]]}]'"
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class CommandGroup(TyperGroup):
    """A group whose commands end with one line and an exit code on error, never a traceback
    (``mainspring --debug`` shows it)."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException, KeyboardInterrupt):
            raise
        except BrokenPipeError:
            # The reader went away (`mainspring events tail | head -2`): stop quietly, as a Unix filter does. Python's
            # recipe: point stdout at /dev/null so that flushing it at exit does not fail again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        except Exception as exc:
            if Debug.enabled:
                traceback.print_exc(file=sys.stderr)
            err.print("[red]error:[/red] " + escape(describe(exc)), soft_wrap=True, emoji=False)
            raise typer.Exit(exit_code_of(exc)) from None


class LazyGroup(CommandGroup):
    """A group whose commands in ``lazy`` (name → ``"module:attribute"``, a ``typer.Typer`` or a command
    function) are imported when they are used or listed, as click's docs on lazily loading subcommands
    describe: a command imports what it runs and nothing else."""

    lazy: dict[str, str] = {}

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *(name for name in self.lazy if name not in self.commands)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.commands[cmd_name] = _load_command(cmd_name, self.lazy[cmd_name])
        return super().get_command(ctx, cmd_name)


def _load_command(name: str, spec: str) -> Any:
    module, _, attribute = spec.partition(":")
    target = getattr(importlib.import_module(module), attribute)
    if isinstance(target, typer.Typer):
        command: Any = typer.main.get_group(target)  # as add_typer mounts it: no completion options of its own
    else:
        single = typer.Typer(add_completion=False)
        single.command(name)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


def each(items: Sequence[str], what: str) -> Iterator[str]:
    """Iterate a bulk command's items with a progress bar on a terminal (plain otherwise)."""
    if err.is_terminal and len(items) > 1:
        from rich.progress import track

        yield from track(items, description=what, console=err, transient=True)
    else:
        yield from items
