"""``mainspring machines list|show|repair`` against a live server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import httpx
from typer.testing import CliRunner

from mainspring.machines.cli import cli
from mainspring.machines.processor import Unprocessable
from tests.machines.conftest import NS, FakeProcessor


async def run_cli(*args: str) -> Any:
    # The server under test runs on this event loop: the blocking CLI runs beside it.
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args))


async def test_an_operator_finds_a_failed_machine_and_repairs_it_from_the_command_line(
    client: httpx.AsyncClient, fake: FakeProcessor, live_url: str
) -> None:
    for machine_id in ("ok1", "bad1"):
        assert (await client.post(f"/v1/namespaces/{NS}/machines", json={"id": machine_id})).status_code == 201

    def refuse(args: Any, machine: Any) -> Any:
        raise Unprocessable("the ledger is corrupt")

    fake.on("call", refuse)
    assert (await client.post(f"/v1/namespaces/{NS}/machines/bad1/call", json={"args": 1})).status_code == 502

    listed = await run_cli("list", NS, "--status", "failed", "--url", live_url, "--json")
    assert listed.exit_code == 0, listed.output
    assert [m["id"] for m in json.loads(listed.output)] == ["bad1"]

    shown = await run_cli("show", NS, "bad1", "--url", live_url)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["status"] == "failed"
    assert "the ledger is corrupt" in shown.output

    repaired = await run_cli("repair", NS, "bad1", "--args", '{"fix": true}', "--key", "r1", "--url", live_url)
    assert repaired.exit_code == 0, repaired.output
    assert json.loads(repaired.output) == "repaired"
    assert (await client.get(f"/v1/namespaces/{NS}/machines/bad1")).json()["status"] == "working"

    again = await run_cli("repair", NS, "bad1", "--url", live_url)
    assert again.exit_code == 1
    assert "machine_already_working" in again.output or "409" in again.output

    bad_args = await run_cli("repair", NS, "bad1", "--args", "{not json", "--url", live_url)
    assert bad_args.exit_code == 2


async def test_a_simple_repair_prints_the_machines_status_not_null(
    client: httpx.AsyncClient, fake: FakeProcessor, live_url: str
) -> None:
    assert (await client.post(f"/v1/namespaces/{NS}/machines", json={"id": "bad2"})).status_code == 201

    def refuse(args: Any, machine: Any) -> Any:
        raise Unprocessable("the ledger is corrupt")

    fake.on("call", refuse)
    assert (await client.post(f"/v1/namespaces/{NS}/machines/bad2/call", json={"args": 1})).status_code == 502
    repaired = await run_cli("repair", NS, "bad2", "--simple", "--url", live_url)
    assert repaired.exit_code == 0, repaired.output
    assert repaired.output == "bad2 working (repaired without calling the processor)\n"


async def test_the_machine_commands_start_call_and_notify(client: httpx.AsyncClient, fake: FakeProcessor, live_url: str) -> None:
    started = await run_cli("start", NS, "m1", "--args", '{"amount": 5}', "--key", "s1", "--url", live_url)
    assert started.exit_code == 0, started.output
    assert json.loads(started.output)["id"] == "m1"
    fake.on("call", lambda args, machine: {"response": {"echo": args}})
    called = await run_cli("call", NS, "m1", "--args", '{"ping": 1}', "--url", live_url)
    assert called.exit_code == 0, called.output
    assert json.loads(called.output) == {"echo": {"ping": 1}}
    notified = await run_cli("notify", NS, "m1", "--args", '"wake"', "--url", live_url)
    assert notified.exit_code == 0 and notified.output.strip(), notified.output
    again = await run_cli("start", NS, "m1", "--url", live_url)
    assert again.exit_code == 1 and "machine_already_exists" in again.output


def test_the_machines_group_is_part_of_the_mainspring_command() -> None:
    shown = subprocess.run([sys.executable, "-m", "mainspring.cli", "machines", "--help"], capture_output=True, text=True, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "repair" in shown.stdout and "list" in shown.stdout
