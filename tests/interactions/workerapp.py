"""The user code the worker-process tests run: each handler writes what it did to ``$MS_TEST_LOG``."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from mainspring.app import App

app = App()


def record(kind: str, item: Any, **extra: Any) -> None:
    line = json.dumps({"kind": kind, "id": item.id, "pid": os.getpid(), "at": time.time(), **extra})
    with open(os.environ["MS_TEST_LOG"], "a") as f:
        f.write(line + "\n")


if os.environ.get("MS_TEST_LOG"):
    with open(os.environ["MS_TEST_LOG"], "a") as boot:
        boot.write(json.dumps({"kind": "boot", "id": None, "pid": os.getpid(), "at": time.time()}) + "\n")


# One at a time per process: the queue's limit of 2 can then only be reached by two processes at once,
# which is what the cross-process test must exercise (with 5, one fast process could take every item).
@app.queue("limited", concurrency=1)
async def limited(item: Any) -> Any:
    record("start", item)
    await asyncio.sleep(0.15)
    record("end", item)
    return {"pid": os.getpid()}


@app.queue("rated", concurrency=5)
async def rated(item: Any) -> Any:
    record("start", item, expires_at=item.lease.expires_at)
    return None


@app.queue("fragile", concurrency=1)
def fragile(item: Any) -> Any:
    marker = Path(os.environ["MS_TEST_LOG"] + ".first")
    record("start", item)
    if not marker.exists():
        marker.write_text("killed here")
        time.sleep(120)
    record("done", item)
    return "survived"
