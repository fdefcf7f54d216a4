"""Write docs/http.md, the HTTP API's reference, from the server's route table (its OpenAPI document).

    python scripts/http_docs.py            # regenerate
    python scripts/http_docs.py --check    # exit 1 if the page is not up to date (make lint runs this)
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path
from typing import Any

from mainspring.api import create_app
from mainspring.config import load_settings

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "http.md"

COMMON = {"401", "403", "413", "422", "429", "503"}
"""Problems every authenticated operation can answer: said once in the introduction, not on each row."""

INTRO = """# HTTP API reference

<!-- Generated from the route table by scripts/http_docs.py: edit the operations' docstrings and models, not this page. -->

Every operation of `mainspring serve`, face by face. A running server serves the same description as OpenAPI 3.1
at `/openapi.json`, with every schema, and browsable at `/docs`. Bodies are JSON; times are RFC 3339 in UTC;
durations are integers in milliseconds (`*_ms`).

**Auth.** With tokens configured (`mainspring token create`), every `/v1` operation needs `Authorization: Bearer
<token>` whose scopes allow it (`admin`, `ui`, `queues:<queue>`, `machines:<ns>`, `exchange:…`, `batching:…`);
`/healthz`, `/readyz` and `/metrics` never do.

**Errors** are `application/problem+json` with a stable `code` (and `status`, `title`, `detail`). A bad request
changes nothing. Besides the codes on each row, any operation may answer 401 `unauthenticated`, 403 `forbidden`,
413 `too_large`, 422 `invalid_request`, 429 `rate_limited` and 503 `unavailable` (the store is unreachable: try
again). A 2xx means the change is committed.
"""


def _schema_name(content: dict[str, Any] | None) -> str:
    if not content:
        return ""
    schema = next(iter(content.values())).get("schema", {})
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if schema.get("type") == "array" and "$ref" in schema.get("items", {}):
        return f"`list[{schema['items']['$ref'].rsplit('/', 1)[-1]}]`"
    return f"`{schema.get('type', 'json')}`" if schema else ""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")


def render(document: dict[str, Any]) -> str:
    sections: dict[str, list[str]] = {}
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            tag = (operation.get("tags") or ["service"])[0]
            body = _schema_name(operation.get("requestBody", {}).get("content"))
            answers, problems = [], []
            for status, response in sorted(operation.get("responses", {}).items()):
                if status.startswith("2"):
                    answers.append(f"{status} {_schema_name(response.get('content'))}".strip())
                elif status not in COMMON:
                    codes = response.get("description", "").split(": ", 1)[-1]
                    problems.append(f"{status} {codes}")
            summary = _cell(operation.get("summary") or operation.get("description") or "")
            sections.setdefault(tag, []).append(
                f"| `{method.upper()} {path}` | {summary} | {body} | {', '.join(answers)} | {_cell(', '.join(problems))} |")
    lines = [INTRO]
    for tag, rows in sections.items():
        lines += [f"## {tag[:1].upper() + tag[1:]}", "", "| operation | what it does | body | answer | problems |",
                  "| --- | --- | --- | --- | --- |", *rows, ""]
    return "\n".join(lines).rstrip() + "\n"


def document() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:  # the app is built, never started: no store is opened
        settings = load_settings(None, server={"database": f"sqlite:///{scratch}/unused.db"})
        return create_app(settings, run_background=False).openapi()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if docs/http.md is not up to date")
    page = render(document())
    if parser.parse_args().check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != page:
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), page.splitlines(True), "docs/http.md", "generated"))
            print("docs/http.md is out of date: run `make http-docs`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
