"""Write docs/configuration.md from the settings models: every key, its default and its description.

    python scripts/config_docs.py            # regenerate
    python scripts/config_docs.py --check    # exit 1 if the page is not up to date (make lint runs this)
"""

from __future__ import annotations

import argparse
import difflib
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from mainspring.config import Settings

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "configuration.md"

INTRO = """# Configuration

<!-- Generated from the settings models by scripts/config_docs.py: edit the models' docstrings, not this page. -->

Sources, later winning key by key: the TOML file (`--config FILE` or `$MAINSPRING_CONFIG`), environment
variables `MAINSPRING_<SECTION>__<KEY>` (for example `MAINSPRING_SERVER__PORT=9000`; lists and tables as
JSON), then command-line flags. Durations are integers in milliseconds (`*_ms`). A config file that does not
exist, does not parse, or names a key that is not below is an error that names it; so is a `MAINSPRING_*`
variable that names no setting (`MAINSPRING_SERVER__PROT` is refused, with the setting it most likely meant),
apart from the commands' own `MAINSPRING_CONFIG`, `MAINSPRING_URL`, `MAINSPRING_TOKEN` and `MAINSPRING_DEBUG`
and the project's test tools' `MAINSPRING_TEST_*`, `MAINSPRING_BENCH_*`, `MAINSPRING_CHAOS_*`, `MAINSPRING_FUZZ_*`.
"""

EXAMPLE = """## An example

```toml
[server]
database = "sqlite:///mainspring-data/mainspring.db"
port = 8080
log_format = "json"
rate_limit = "200/second"

[auth]
cache_ms = 2000

[[auth.tokens]]
name = "ops"
token_sha256 = "5f2b6c2f0e0a4a7c7bd4d3b0d2a6f1e9c8b7a6f5e4d3c2b1a09f8e7d6c5b4a39"
scopes = ["admin"]

[events]
types = ["machine.*", "alert.raised"]
webhooks = [{ url = "http://127.0.0.1:9999/events", secret = "change-me" }]

[exchange]
process_timeout_ms = 300000
backup = true

[machines.namespaces.invoices]
processor = { url = "http://127.0.0.1:9000/", timeout_ms = 5000 }
retry = { initial_ms = 500, factor = 2, max_ms = 60000, max_attempts = 10 }

[interactions]
error_delay_ms = 2000

[batching]
worker_poll_ms = 1000
```
"""


def default_of(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Path):
        return f'`"{value.as_posix() if value.is_absolute() else "./" + value.as_posix()}"`'
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, int) and value >= 10_000:
        return f"`{value}`"
    return f"`{value!r}`".replace("'", '"')


def nested(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The model inside a field's type, and how it nests: ``table``, ``array`` or ``map``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, "table"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            model, how = nested(arg)
            if model is not None:
                return model, how
    if origin is list and args:
        model, _ = nested(args[0])
        return model, "array"
    if origin is dict and len(args) == 2:
        model, _ = nested(args[1])
        return model, "map"
    return None, ""


def section(name: str, model: type[BaseModel], level: int, header: str) -> list[str]:
    lines = [f"{'#' * level} `{header}`", ""]
    if model.__doc__ and model.__doc__.strip() and "Create a new model" not in model.__doc__:
        lines += [" ".join(model.__doc__.split()).replace("``", "`"), ""]
    lines += ["| key | default | meaning |", "| --- | --- | --- |"]
    later: list[list[str]] = []
    for key, field in model.model_fields.items():
        description = " ".join((field.description or "").split()).replace("``", "`").replace("|", "\\|")
        lines.append(f"| `{key}` | {default_of(field)} | {description} |")
        inner, how = nested(field.annotation)
        if inner is not None:
            path = f"{name}.{key}"
            title = {"table": f"[{path}]", "array": f"[[{path}]]", "map": f"[{path}.<name>]"}[how]
            child = f"{path}.<name>" if how == "map" else path
            later.append(section(child, inner, min(level + 1, 4), title))
    lines.append("")
    for block in later:
        lines += block
    return lines


def render() -> str:
    lines = [INTRO]
    for name, field in Settings.model_fields.items():
        model, _ = nested(field.annotation)
        assert model is not None
        lines += section(name, model, 2, f"[{name}]")
    return "\n".join(lines) + "\n" + EXAMPLE


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the page is up to date")
    args = parser.parse_args()
    page = render()
    if not args.check:
        PAGE.write_text(page, encoding="utf-8")
        print(f"wrote {PAGE.relative_to(ROOT)}")
        return 0
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    if current == page:
        return 0
    sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), page.splitlines(True), str(PAGE), "generated"))
    print("docs/configuration.md is stale: run `make config-docs`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
