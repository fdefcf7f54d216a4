"""Write the sync clients (``src/mainspring/client/_sync``) from the async ones (``client/_async``).

    python scripts/sync_clients.py            # regenerate
    python scripts/sync_clients.py --check    # exit 1 if the generated files are not up to date

The async clients are the one description of each face's calls; this turns ``async def``/``await`` and
the async names into their sync twins (the httpcore way), so the two are never written twice.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

import unasync

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "mainspring" / "client" / "_async"
TARGET = ROOT / "src" / "mainspring" / "client" / "_sync"
HEADER = "# Generated from client/_async by scripts/sync_clients.py: edit that file, not this one.\n"

REPLACEMENTS = {
    "AsyncBaseClient": "BaseClient",
    "AsyncEventsClient": "EventsClient",
    "AsyncInteractionsClient": "InteractionsClient",
    "AsyncBatchingClient": "BatchingClient",
    "AsyncMachinesClient": "MachinesClient",
    "AsyncExchangeClient": "ExchangeClient",
    "AsyncWorkflowsClient": "WorkflowsClient",
    "AsyncClient": "Client",
    "AsyncBaseTransport": "BaseTransport",
    "AsyncRetrying": "Retrying",
    "aclose": "close",
    "_async": "_sync",
}


def generate(target: Path) -> list[Path]:
    """Write the sync modules under ``target``; answers their paths."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "_async"
        work.mkdir()
        sources = sorted(SOURCE.glob("*.py"))
        for source in sources:
            (work / source.name).write_text(source.read_text())
        rule = unasync.Rule(fromdir="/_async/", todir="/_sync/", additional_replacements=REPLACEMENTS)
        unasync.unasync_files([str(work / s.name) for s in sources], [rule])
        target.mkdir(parents=True, exist_ok=True)
        written = []
        for source in sources:
            text = (Path(tmp) / "_sync" / source.name).read_text()
            out = target / source.name
            out.write_text(HEADER + text)
            written.append(out)
        return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that client/_sync is up to date")
    args = parser.parse_args()
    if not args.check:
        for path in generate(TARGET):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        stale = 0
        for fresh in generate(Path(tmp)):
            current = TARGET / fresh.name
            old = current.read_text() if current.exists() else ""
            if old != fresh.read_text():
                stale += 1
                sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), fresh.read_text().splitlines(True),
                                                           str(current), "generated"))
        expected = {p.name for p in SOURCE.glob("*.py")}
        for extra in {p.name for p in TARGET.glob("*.py")} - expected:
            stale += 1
            print(f"{TARGET / extra}: has no source in client/_async")
        if stale:
            print("client/_sync is stale: run `make sync-clients`", file=sys.stderr)
        return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
