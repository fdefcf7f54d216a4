"""A workflow for tests/workflows/test_worker.py: it sleeps a second (real time) between two steps."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mainspring import App, Workflow

app = App()


def note(what: str) -> str:
    with (Path(os.environ.get("WORKER_DIR", ".")) / "calls.txt").open("a") as f:
        f.write(f"{what} {os.getpid()}\n")
    return what


@app.workflow("naps")
async def nap(wf: Workflow, args: Any) -> Any:
    before = await wf.step(note, "before")
    await wf.sleep(1000)
    return [before, await wf.step(note, "after")]
