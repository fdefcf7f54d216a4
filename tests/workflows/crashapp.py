"""A workflow whose second step can freeze its server after the step's function returned and before its record
is written (tests/workflows/test_crash.py kills the server there)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mainspring import App, Workflow

app = App()
CALLS = Path(os.environ.get("CRASH_DIR", ".")) / "calls.txt"
FROZEN = Path(os.environ.get("CRASH_DIR", ".")) / "frozen"


class FreezesWhenRecorded(dict):  # type: ignore[type-arg]
    """A result whose JSON encoding (the record being written) freezes the server once."""

    def items(self) -> Any:
        if not FROZEN.exists():
            FROZEN.write_text("returned, not recorded")
            time.sleep(120)  # the event loop stops here: the test kills the process
        return super().items()


def freeze() -> None:
    """Stop the event loop (the test kills the process meanwhile)."""
    time.sleep(120)


def call(name: str, key: str) -> None:
    with CALLS.open("a") as f:
        f.write(f"{name} {key}\n")


@app.workflow("crashy")
async def crashy(wf: Workflow, args: Any) -> Any:
    async def first() -> str:
        call("first", wf.key)
        return "one"

    async def second() -> Any:
        call("second", wf.key)
        return FreezesWhenRecorded(two=2)

    async def third() -> str:
        call("third", wf.key)
        return "three"

    return [await wf.step(first), await wf.step(second), await wf.step(third)]


STARTED = Path(os.environ.get("CRASH_DIR", ".")) / "started"


@app.workflow("frozen_at_start")
async def frozen_at_start(wf: Workflow, args: Any) -> Any:
    if not STARTED.exists():
        # The run is created (with this server's lease, in one round trip on PostgreSQL) and its function has
        # begun, but no step has run: the event loop stops here and the test kills the process.
        STARTED.write_text("created, no step yet")
        freeze()

    async def only() -> str:
        call("only", wf.key)
        return "done"

    return await wf.step(only)
