"""The real server process: start-up, graceful SIGTERM, several servers on one database, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

from tests.conftest import ServerProcess


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mainspring.cli", *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_sigterm_mid_request_finishes_it(servers: Any) -> None:
    (server,) = servers(1)
    result: dict[str, Any] = {}
    sending = threading.Event()

    def long_poll() -> None:
        with httpx.Client(timeout=30, event_hooks={"request": [lambda _request: sending.set()]}) as client:
            result["response"] = client.get(server.url + "/v1/events", params={"after": "999999", "wait_ms": 3000})

    thread = threading.Thread(target=long_poll)
    thread.start()
    assert sending.wait(30)
    # A request answered after the long poll was sent means the server has read the long poll too (a fixed
    # sleep was not enough on a loaded machine: the signal came before the request).
    time.sleep(0.2)
    assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200
    server.proc.send_signal(signal.SIGTERM)
    thread.join(30)
    assert result["response"].status_code == 200
    assert result["response"].json()["events"] == []
    # uvicorn re-raises the signal once it has shut down cleanly, so the exit status is SIGTERM's.
    assert server.proc.wait(30) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in server.log()


def test_several_servers_share_one_database(servers: Any, database_url: str) -> None:
    a, b = servers(2)
    for server in (a, b):
        assert httpx.get(server.url + "/readyz").json()["status"] == "ready"
    assert "OPEN" in a.log()


def test_cli_token_create_list_revoke(database_url: str, tmp_path: Any) -> None:
    created = cli("token", "create", "--scope", "queues:emails", "--scope", "admin", "--name", "ops", "--database", database_url)
    assert created.returncode == 0, created.stderr
    token_id = created.stdout.split("id: ")[1].split()[0]
    token = created.stdout.split("token: ")[1].split()[0]
    listed = cli("token", "list", "--database", database_url)
    assert token_id in listed.stdout and "queues:emails" in listed.stdout and token not in listed.stdout
    assert cli("token", "revoke", token_id, "--database", database_url).returncode == 0
    assert "revoked" in cli("token", "revoke", token_id, "--database", database_url).stderr + "revoked"


def test_server_requires_a_created_token(database_url: str, tmp_path: Any) -> None:
    created = cli("token", "create", "--scope", "admin", "--database", database_url)
    token = created.stdout.split("token: ")[1].split()[0]
    server = ServerProcess(database_url, tmp_path / "data").start()
    try:
        assert httpx.get(server.url + "/v1/events").status_code == 401
        assert httpx.get(server.url + "/v1/events", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert token not in server.log()
    finally:
        server.kill()


def test_cli_migrate_is_idempotent_and_alerts_and_events_are_read_over_http(database_url: str, tmp_path: Any) -> None:
    assert cli("migrate", "--database", database_url).returncode == 0
    assert cli("migrate", "--database", database_url).returncode == 0
    server = ServerProcess(database_url, tmp_path / "data").start()
    try:
        listed = cli("alerts", "list", "--url", server.url, "--json")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == []
        httpx.put(server.url + "/v1/queues/q", json={}).raise_for_status()
        httpx.post(server.url + "/v1/queues/q/interactions", json={"data": 1}).raise_for_status()
        deadline = time.monotonic() + 30
        while True:  # on PostgreSQL the sequencer numbers the event a moment after its commit
            tail = cli("events", "tail", "--no-follow", "--types", "interaction.*", "--url", server.url)
            assert tail.returncode == 0, tail.stderr
            if tail.stdout or time.monotonic() > deadline:
                break
        assert [json.loads(line)["type"] for line in tail.stdout.splitlines()] == ["interaction.created"]
    finally:
        server.kill()


def test_settings_come_from_file_then_env(tmp_path: Any) -> None:
    from mainspring.config import load_settings

    config = tmp_path / "mainspring.toml"
    config.write_text('[server]\nport = 9000\n[exchange]\nprocess_timeout_ms = 5000\ncommit_timeout_ms = 7000\n')
    os.environ["MAINSPRING_EXCHANGE__PROCESS_TIMEOUT_MS"] = "1000"
    try:
        settings = load_settings(config, server={"host": "0.0.0.0"})
    finally:
        del os.environ["MAINSPRING_EXCHANGE__PROCESS_TIMEOUT_MS"]
    assert settings.server.port == 9000
    assert settings.server.host == "0.0.0.0"
    assert settings.exchange.process_timeout_ms == 1000
    assert settings.exchange.commit_timeout_ms == 7000
