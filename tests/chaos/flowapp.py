"""The chaos profile's workflow (``serve --app tests.chaos.flowapp:app`` on every server of the run).

Every call of a step's function appends one line to a file all servers share — the run, the step's place in
the body, ``wf.key`` and a token new to this call — and the step's recorded result is that token. So the
checker can tell, per step, how often its function ran, with which keys, and whether a call came after the one
whose result was recorded (a recorded step called again).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

from mainspring import App, Workflow

app = App()
STEPS = 4
"""Steps per run, with a durable sleep after the second."""
CALLS_FILE = "MAINSPRING_CHAOS_FLOW_CALLS"
"""The environment variable naming the shared file of step calls."""


def calls_path(workdir: Path) -> Path:
    """The file of a chaos run (its work directory) that every server's steps append their calls to."""
    return workdir / "flow-calls.jsonl"


def log_call(run_id: str, place: int, key: str | None) -> str:
    token = uuid.uuid4().hex
    # The true time (a chaos run steps this server's time.time, not CLOCK_REALTIME), to compare with the nemesis's.
    at = time.clock_gettime(time.CLOCK_REALTIME)
    line = json.dumps({"run": run_id, "place": place, "key": key, "token": token, "pid": os.getpid(), "at": at}) + "\n"
    # One write(2) of a short line with O_APPEND: lines of concurrent servers never interleave.
    with Path(os.environ[CALLS_FILE]).open("a") as calls:
        calls.write(line)
    return token


def log_start() -> None:
    """A server's process starts: whatever it replays later, it loaded after this moment."""
    if CALLS_FILE in os.environ:
        with Path(os.environ[CALLS_FILE]).open("a") as calls:
            calls.write(json.dumps({"started": os.getpid(), "at": time.clock_gettime(time.CLOCK_REALTIME)}) + "\n")


log_start()


@app.workflow("chaosflow")
async def chaosflow(wf: Workflow, args: Any) -> Any:
    async def act(place: int) -> str:
        token = log_call(wf.id, place, wf.key)
        # The step "works" a while after its effect, so a SIGKILL often lands between the effect and the record.
        await asyncio.sleep(random.uniform(0.02, 0.3))
        return token

    tokens = []
    for place in range(1, STEPS + 1):
        tokens.append(await wf.step(act, place, name=f"act{place}"))
        if place == 2:
            await wf.sleep(int(args.get("sleep_ms", 300)))
    return tokens
