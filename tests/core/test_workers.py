"""``mainspring serve --workers N``: N server processes on one port, one PostgreSQL, every guarantee held."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from mainspring.core import outbox
from mainspring.store import Store
from tests.conftest import free_port, show_log_on_failure


def _serve(database_url: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    log = tmp_path / "serve.log"
    show_log_on_failure(f"server on port {port}", log)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mainspring.cli", "serve", "--port", str(port), "--database", database_url,
         "--data-dir", str(tmp_path / "data"), *args],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MAINSPRING_SERVER__POLL_INTERVAL_MS": "200", **(env or {})},
    )
    return proc, f"http://127.0.0.1:{port}", log


def _worker_pids(supervisor: int) -> set[int]:
    """The server processes uvicorn's supervisor started (its multiprocessing helpers are not servers)."""
    found = set()
    for task in Path(f"/proc/{supervisor}/task").glob("*"):
        for pid in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"multiprocessing.spawn" in cmdline and b"resource_tracker" not in cmdline:
                found.add(int(pid))
    return found


async def _both_workers_ready(proc: subprocess.Popen[bytes], client: httpx.AsyncClient, log_text: Callable[[], str]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            ready = log_text().count("ready on postgresql") == 2
            if ready and (await client.get("/readyz")).status_code == 200 and len(_worker_pids(proc.pid)) == 2:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, log_text()[-3000:]
        assert time.monotonic() < deadline, log_text()[-3000:]
        await asyncio.sleep(0.1)


async def test_serve_with_two_workers_shares_one_port_and_loses_nothing(engine: str, database_url: str, tmp_path: Path) -> None:
    if engine != "postgres":
        pytest.skip("several workers run on PostgreSQL (SQLite refuses, see the next test)")
    proc, url, log = _serve(database_url, tmp_path, "--workers", "2")
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            await _both_workers_ready(proc, client, log.read_text)
            answers = await asyncio.gather(*(client.post("/v1/queues/w/interactions", json={"data": i}) for i in range(200)))
            assert [a.status_code for a in answers] == [201] * 200
            ids = {a.json()["id"] for a in answers}
            assert len(ids) == 200
        store = Store(database_url)
        try:
            await outbox.wait_numbered(store)
            events, _ = await outbox.read_events(store, 0, 1000, ["interaction.created"])
        finally:
            await store.close()
        assert {e["subject"]["id"] for e in events} == ids
        assert log.read_text().count("ready on postgresql") == 2
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    assert "Traceback" not in log.read_text()


def test_serve_refuses_workers_on_sqlite(engine: str, database_url: str, tmp_path: Path) -> None:
    if engine != "sqlite":
        pytest.skip("the refusal is SQLite's")
    proc, _url, log = _serve(database_url, tmp_path, "--workers", "2")
    assert proc.wait(60) != 0
    assert "several workers need PostgreSQL" in log.read_text()


def _listening(port: int) -> int:
    """How many sockets listen on this TCP port (each process's own with SO_REUSEPORT)."""
    rows = [line.split() for name in ("/proc/net/tcp", "/proc/net/tcp6") for line in Path(name).read_text().splitlines()[1:]]
    return sum(1 for row in rows if row[1].rsplit(":", 1)[1] == f"{port:04X}" and row[3] == "0A")


async def test_every_worker_serves_machineguns_own_listener(engine: str, database_url: str, tmp_path: Path) -> None:
    if engine != "postgres":
        pytest.skip("several workers run on PostgreSQL")
    pytest.importorskip("thriftpy2")
    from mainspring.machines.machinegun import woody
    from mainspring.machines.machinegun.idl import Automaton, stateproc

    listen = free_port()
    env = {"MAINSPRING_MACHINES__MACHINEGUN__LISTEN": f"127.0.0.1:{listen}", "MAINSPRING_MACHINES__MACHINEGUN__AUTH": "none"}
    proc, url, log = _serve(database_url, tmp_path, "--workers", "2", env=env)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            await _both_workers_ready(proc, client, log.read_text)
            deadline = time.monotonic() + 30
            while _listening(listen) < 2:  # each worker starts its listener with its loops
                assert time.monotonic() < deadline and "could not listen" not in log.read_text(), log.read_text()[-3000:]
                await asyncio.sleep(0.1)
        call = woody.encode_call(Automaton, "GetMachine", {"desc": stateproc.MachineDescriptor(ns="nowhere", ref=stateproc.Reference(id="m"))})
        for _ in range(20):  # new connections each time: the kernel spreads them over both processes
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listen}", timeout=10) as mg:
                trace = woody.root_trace().child().headers()
                reply = await mg.post("/v1/automaton", content=call, headers={"content-type": woody.CONTENT_TYPE, **trace})
                assert (reply.status_code, reply.headers.get(woody.ERROR_REASON)) == (200, "NamespaceNotFound")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    assert "could not listen" not in log.read_text() and "Traceback" not in log.read_text()
