"""``mainspring exchange``: mailboxes, processes by state, resolve — over a running server's API."""

from __future__ import annotations

import asyncio
import json

from typer.testing import CliRunner

from mainspring.exchange.cli import cli
from tests.exchange.conftest import COMMIT_TIMEOUT_MS, MAILBOX, process, put, settle, start


async def invoke(url: str, *args: str):
    # The server under test runs on this event loop: the blocking CLI runs beside it.
    return await asyncio.to_thread(CliRunner().invoke, cli, [*args, "--url", url])


async def test_cli_lists_mailboxes_and_processes_by_state(client, live_url):
    m = await put(client, b"x")
    await put(client, b"y")
    pid = (await start(client, [m["id"]])).json()["id"]
    boxes = await invoke(live_url, "mailboxes", "--json")
    assert boxes.exit_code == 0, boxes.output
    assert json.loads(boxes.output) == [{"addressee": "mobile-a", "database": "db-1", "available": 1, "active_process_id": pid}]
    started = await invoke(live_url, "processes", "--state", "STARTED", "--json")
    assert [p["id"] for p in json.loads(started.output)] == [pid]
    assert json.loads((await invoke(live_url, "processes", "--state", "DONE", "--json")).output) == []
    assert (await invoke(live_url, "processes", "--state", "NOPE")).exit_code != 0


async def test_cli_resolves_an_in_doubt_process_and_refuses_others(app, client, clock, live_url, exchange_dir):
    m = await put(client, b"x")
    pid = (await start(client, [m["id"]])).json()["id"]
    await client.post(f"/v1/exchange/processes/{pid}/ready")
    refused = await invoke(live_url, "resolve", pid, "--committed")
    assert refused.exit_code == 1 and "not_in_doubt" in refused.output
    clock.advance(COMMIT_TIMEOUT_MS)
    await settle(app)
    resolved = await invoke(live_url, "resolve", pid, "--not-committed")
    assert resolved.exit_code == 0, resolved.output
    assert json.loads(resolved.output)["state"] == "ABORTED"
    assert (await process(client, pid))["state"] == "ABORTED"
    assert [x["id"] for x in (await client.get(f"{MAILBOX}/messages")).json()["messages"]] == [m["id"]]
    assert (exchange_dir / "mailboxes/mobile-a/db-1" / m["id"]).exists(), "moved back from unknown/"
