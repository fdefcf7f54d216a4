"""The ``mainspring`` command as a user meets it: version, help, errors as one line, --json, the new groups."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from mainspring.cli import cli
from mainspring.core import cli as common
from tests.batching.conftest import wait_status
from tests.conftest import free_port


def mainspring(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MAINSPRING_")}
    return subprocess.run([sys.executable, "-m", "mainspring.cli", *args], cwd=cwd, env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=120)


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    for word in words:
        assert word in lines[0], lines[0]


def test_version_flag_prints_the_version() -> None:
    done = mainspring("--version")
    assert done.returncode == 0 and done.stdout.strip() == "mainspring 0.1.0"


SERVER_MODULES = ("fastapi", "sqlalchemy", "alembic", "uvicorn", "mainspring.api", "mainspring.store", "mainspring.config")


@pytest.mark.parametrize("command", [["--version"], ["interactions", "list", "emails"], ["alerts", "list"],
                                     ["machines", "list", "invoices"], ["exchange", "mailboxes"], ["batching", "tasks", "books"],
                                     ["workflows", "list", "orders"]])
def test_client_commands_import_the_client_and_no_server_code(command: list[str]) -> None:
    """What makes a command slow to start is what it imports (2.4 s when every command loaded the server)."""
    probe = ("import sys; from typer.testing import CliRunner; from mainspring.cli import cli; "
             "CliRunner().invoke(cli, sys.argv[1:]); "
             f"print(sorted(m for m in sys.modules if m.startswith({SERVER_MODULES!r})))")
    url = ["--url", f"http://127.0.0.1:{free_port()}"] if command != ["--version"] else []
    done = subprocess.run([sys.executable, "-c", probe, *command, *url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_every_faces_command_group_is_mounted() -> None:
    from mainspring.api import FACES
    from mainspring.cli import MainspringGroup

    faces = {face.name for face in FACES if face.cli is not None}
    assert faces <= set(MainspringGroup.lazy)
    for face in FACES:
        if face.cli is not None:
            module, _, attribute = MainspringGroup.lazy[face.name].partition(":")
            assert getattr(sys.modules[module], attribute) is face.cli
    top = CliRunner().invoke(cli, ["--help"], env={"COLUMNS": "200"}).output
    assert all(f" {name} " in top for name in MainspringGroup.lazy), top


def test_make_run_takes_the_port_and_the_database() -> None:
    root = Path(__file__).resolve().parents[1]
    plan = subprocess.run(["make", "-n", "run", "PORT=19601", "DATABASE=postgresql://mainspring@db.internal/mainspring"],
                          cwd=root, capture_output=True, text=True, check=True).stdout
    assert ".venv/bin/mainspring serve --port 19601 --database 'postgresql://mainspring@db.internal/mainspring'" in plan, plan
    default = subprocess.run(["make", "-n", "run"], cwd=root, capture_output=True, text=True, check=True).stdout
    assert ".venv/bin/mainspring serve --port 8080\n" in default, default


def test_help_texts_render_their_defaults_and_no_jargon() -> None:
    result = CliRunner().invoke(cli, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "Listen address. [default: (127.0.0.1)]" in result.output
    assert "Listen port. [default: (8080)]" in result.output
    top = CliRunner().invoke(cli, ["--help"], env={"COLUMNS": "200"}).output
    assert "seed" not in top and "interactions" in top and "batching" in top


def test_a_server_that_is_down_is_one_line_and_exit_code_3() -> None:
    one_line_error(mainspring("alerts", "list", "--url", f"http://127.0.0.1:{free_port()}"), 3, "unreachable", "Connection refused")


def test_a_server_url_without_a_scheme_is_one_line_and_exit_code_2() -> None:
    one_line_error(mainspring("interactions", "list", "q", "--url", "localhost:8080"), 2, "invalid_url", "localhost:8080")


def test_config_file_errors_name_the_file_or_the_key(tmp_path: Path) -> None:
    one_line_error(mainspring("migrate", "--config", str(tmp_path / "missing.toml")), 2, "missing.toml", "does not exist")
    broken = tmp_path / "broken.toml"
    broken.write_text("[server\nport = 1\n")
    one_line_error(mainspring("migrate", "--config", str(broken)), 2, "broken.toml", "not valid TOML")
    typo = tmp_path / "typo.toml"
    typo.write_text("[server]\nprot = 9000\n")
    one_line_error(mainspring("serve", "--config", str(typo)), 2, "unknown key server.prot")
    out_of_range = tmp_path / "range.toml"
    out_of_range.write_text("[server]\nport = 99999\n")
    one_line_error(mainspring("migrate", "--config", str(out_of_range)), 2, "server.port")


def test_a_mistyped_environment_variable_is_one_line_naming_it_and_exit_code_2(tmp_path: Path) -> None:
    done = mainspring("migrate", "--data-dir", str(tmp_path / "data"), env={"MAINSPRING_SERVER__PROT": "18102"})
    one_line_error(done, 2, "MAINSPRING_SERVER__PROT", "MAINSPRING_SERVER__PORT")
    assert not (tmp_path / "data").exists()


def test_a_bad_app_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    one_line_error(mainspring("worker", "nosuch_module:app", cwd=tmp_path), 2, "no module named 'nosuch_module'")


def test_a_worker_in_a_folder_without_the_servers_store_says_where_it_looked_and_how_to_point_it(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text("from mainspring import App\napp = App()\napp.queue('emails')(lambda item: None)\n")
    done = mainspring("worker", "tasks:app", cwd=tmp_path)
    store = tmp_path.resolve() / "mainspring-data" / "mainspring.db"
    one_line_error(done, 2, f"no store at {store}", "mainspring serve", "--data-dir", "--database", "--url")
    assert "mainspring migrate" not in done.stderr  # a second, empty store would take nobody's work
    assert not (tmp_path / "mainspring-data").exists()


def test_a_worker_waits_for_an_unreachable_store_without_claiming_to_migrate_it(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text("from mainspring import App\napp = App()\napp.queue('emails')(lambda item: None)\n")
    down = f"postgresql://postgres@127.0.0.1:{free_port()}/day_one_nowhere"
    done = mainspring("worker", "tasks:app", "--database", down, cwd=tmp_path, env={"MAINSPRING_SERVER__STARTUP_WAIT_MS": "300"})
    assert done.returncode == 3, done.stderr
    assert "migrat" not in done.stderr and "waiting for the store" in done.stderr, done.stderr


def test_the_first_start_says_it_created_the_store_in_one_line_without_alembics_own(tmp_path: Path) -> None:
    from tests.conftest import ServerProcess

    server = ServerProcess(f"sqlite:///{tmp_path / 'fresh.db'}", tmp_path / "data").start()
    server.terminate()
    lines = server.log().splitlines()
    assert not [line for line in lines if "alembic" in line], lines
    assert len([line for line in lines if "the store's schema" in line]) == 1, lines


def test_debug_shows_the_traceback() -> None:
    done = mainspring("--debug", "alerts", "list", "--url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 3 and "Traceback" in done.stderr and "ServiceUnavailable" in done.stderr


def test_token_commands_in_a_folder_without_a_store_refuse_and_create_nothing(tmp_path: Path) -> None:
    one_line_error(mainspring("token", "list", cwd=tmp_path), 2, "no store at")
    assert list(tmp_path.iterdir()) == []


def test_every_list_command_has_a_json_option() -> None:
    lists = {("machines", "list"), ("interactions", "list"), ("exchange", "processes"), ("exchange", "mailboxes"),
             ("batching", "packages"), ("batching", "tasks"), ("alerts", "list"), ("token", "list")}
    for group, command in lists:
        result = CliRunner().invoke(cli, [group, command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0 and "--json" in result.output, (group, command)


def test_tables_never_cut_the_ids_the_next_command_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.StringIO()
    monkeypatch.setattr(common, "out", Console(file=buffer, width=50, force_terminal=False))
    long_id = "01J9ZQ3V7H2K8M4N6P0R5S1T3V"
    common.print_table("processes", ["id", "addressee", "state", "started_at"],
                       [{"id": long_id, "addressee": "mobile-with-a-long-name", "state": "IN_DOUBT", "started_at": "2026-11-26T09:00:00.000Z"}])
    assert long_id in buffer.getvalue()


ALERTS = [
    {"id": "a1b2c3d4e5f6", "at": "2026-11-26T09:00:00.123Z", "severity": "error", "code": "machine_failed",
     "subject": "machine:orders/invoice-7", "detail": "the processor refused: the order book is corrupt and cannot be read any more",
     "acked_at": None},
    {"id": "f6e5d4c3b2a1", "at": "2026-11-26T09:05:00.000Z", "severity": "warning", "code": "exchange_in_doubt",
     "subject": "process:01J9ZQ3V7H2K8M4N6P0R5S1T3V", "detail": "no API_4 or API_5", "acked_at": "2026-11-26T10:00:00.000Z"},
]
ALERT_COLUMNS = ["id", "at", "severity", "code", "subject", "detail", "acked_at"]


def printed(monkeypatch: pytest.MonkeyPatch, width: int, terminal: bool, rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    buffer = io.StringIO()
    monkeypatch.setattr(common, "out", Console(file=buffer, width=width, force_terminal=terminal, color_system=None))
    common.print_table("alerts", columns, rows, ids=("id", "subject"))
    return buffer.getvalue().splitlines()


def test_a_table_too_wide_for_an_80_column_terminal_reads_as_one_block_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = printed(monkeypatch, 80, True, ALERTS, ALERT_COLUMNS)
    assert len(lines) <= 20 and all(len(line) <= 80 for line in lines), "\n".join(lines)
    text = " ".join(" ".join(line.split()) for line in lines)
    for alert in ALERTS:
        assert alert["id"] in text and alert["subject"] in text and alert["code"] in text
    assert "the processor refused: the order book is corrupt and cannot be read any more" in text
    assert "2026-11-26 09:00:00" in text  # the time whole, to the second


def test_a_table_that_fits_the_terminal_is_one_line_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = printed(monkeypatch, 220, True, ALERTS, ALERT_COLUMNS)
    [first] = [line for line in lines if "a1b2c3d4e5f6" in line]
    assert "machine_failed" in first and "2026-11-26 09:00:00" in first and "cannot be read any more" in first


def test_a_piped_table_is_plain_columns_one_line_per_row_nothing_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = printed(monkeypatch, 80, False, ALERTS, ALERT_COLUMNS)
    assert len(lines) == 3 and lines[0].split() == ALERT_COLUMNS
    assert lines[1].split()[:5] == ["a1b2c3d4e5f6", "2026-11-26T09:00:00.123Z", "error", "machine_failed", "machine:orders/invoice-7"]
    assert ALERTS[0]["detail"] in lines[1] and lines[2].split()[-1] == "2026-11-26T10:00:00.000Z"
    assert not any(mark in "".join(lines) for mark in "┃│─…")


async def invoke(*args: str) -> Any:
    # The server under test runs on this event loop: the blocking CLI runs beside it.
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args), env={"COLUMNS": "200"})


async def test_the_interactions_commands_list_show_create_cancel_and_schedule(live_url: str) -> None:
    created = await invoke("interactions", "create", "mail", "--data", '{"to": "ada"}', "--message-id", "m-1", "--url", live_url)
    assert created.exit_code == 0, created.output
    item = json.loads(created.output)
    child = await invoke("interactions", "create", "mail", "--parent-id", item["id"], "--name", "step", "--in-ms", "60000", "--url", live_url)
    assert json.loads(child.output)["status"] == "scheduled"
    listed = await invoke("interactions", "list", "mail", "--status", "ready", "--json", "--url", live_url)
    assert [i["message_id"] for i in json.loads(listed.output)] == ["m-1"]
    table = await invoke("interactions", "list", "mail", "--url", live_url)
    assert item["id"] in table.output and "m-1" in table.output
    shown = await invoke("interactions", "show", item["id"], "--json", "--url", live_url)
    assert [c["name"] for c in json.loads(shown.output)["children"]] == ["step"]
    scheduled = await invoke("interactions", "schedule", item["id"], "--in-ms", "5000", "--url", live_url)
    assert scheduled.exit_code == 0 and "scheduled" in scheduled.output
    cancelled = await invoke("interactions", "cancel", item["id"], "--url", live_url)
    assert cancelled.exit_code == 0 and f"{item['id']} cancelled" in cancelled.output
    again = await invoke("interactions", "cancel", item["id"], "--url", live_url)
    assert again.exit_code == 1 and "interaction_finished" in again.output
    queue = await invoke("interactions", "queue", "mail", "--url", live_url)
    assert json.loads(queue.output)["counts"]["cancelled"] == 2


async def test_the_interactions_commands_create_with_a_priority_and_an_owner_and_show_owner_settings(live_url: str, client: Any) -> None:
    await client.put("/v1/queues/tenants", json={"owner_by": "user", "fair": True, "per_owner": {"concurrency": 2}})
    created = await invoke("interactions", "create", "tenants", "--priority", "7", "--user", "ada", "--url", live_url)
    assert created.exit_code == 0, created.output
    assert {k: json.loads(created.output)[k] for k in ("priority", "user")} == {"priority": 7, "user": "ada"}
    bad = await invoke("interactions", "create", "tenants", "--priority", "1001", "--url", live_url)
    assert bad.exit_code == 1 and "invalid_request" in bad.output
    queue = json.loads((await invoke("interactions", "queue", "tenants", "--url", live_url)).output)
    assert (queue["owner_by"], queue["fair"], queue["per_owner"]["concurrency"]) == ("user", True, 2)


async def test_the_interactions_retry_command_makes_failed_items_due_again(live_url: str, client: Any) -> None:
    await client.put("/v1/queues/mail", json={"max_attempts": 1})
    ids = []
    for n in range(2):
        item = (await client.post("/v1/queues/mail/interactions", json={"data": n})).json()
        await client.post(f"/v1/interactions/{item['id']}/fail", json={"error": "no"})
        ids.append(item["id"])
    retried = await invoke("interactions", "retry", *ids, "--url", live_url)
    assert retried.exit_code == 0, retried.output
    assert retried.output.split() == [ids[0], "ready", ids[1], "ready"]


async def test_the_batching_commands_show_settings_tasks_and_packages(live_url: str, client: Any) -> None:
    changed = await invoke("batching", "settings", "books", "--max-size", "2", "--url", live_url)
    assert changed.exit_code == 0 and json.loads(changed.output)["max_size"] == 2
    for member in ("en", "ru"):
        await client.post("/v1/batchers/books/tasks", json={"id": f"7-{member}", "group": "7", "member": member, "content": member})
    # The dispatcher packs the pair as soon as it is complete, after the submit has answered.
    await wait_status(client, ["7-en", "7-ru"], "packed")
    tasks = await invoke("batching", "tasks", "books", "7-en", "7-ru", "--json", "--url", live_url)
    assert {t["status"] for t in json.loads(tasks.output)} == {"packed"}
    packages = await invoke("batching", "packages", "books", "--status", "ready", "--json", "--url", live_url)
    [package] = json.loads(packages.output)
    assert sorted(t["id"] for t in package["tasks"]) == ["7-en", "7-ru"]
    missing = await invoke("batching", "tasks", "books", "nope", "--url", live_url)
    assert missing.exit_code == 1 and "task_not_found" in missing.output


async def test_a_url_that_is_not_the_servers_root_says_there_is_no_mainspring_api_there(live_url: str) -> None:
    result = await invoke("interactions", "list", "emails", "--url", f"{live_url}/v1")
    assert result.exit_code == 2, result.output
    assert f"no Mainspring API at {live_url}/v1" in result.output and f"root, here {live_url}" in result.output, result.output
    # A resource that is not there is still its own error, not this one.
    missing = await invoke("interactions", "show", "999999", "--url", live_url)
    assert missing.exit_code == 1 and "interaction_not_found" in missing.output, missing.output


def test_the_first_token_says_it_closes_the_open_server_and_revoking_the_last_says_it_stays_closed(database_url: str) -> None:
    db = ["--database", database_url]
    first = CliRunner().invoke(cli, ["token", "create", "--scope", "admin", *db], env={"COLUMNS": "200"})
    assert first.exit_code == 0, first.output
    assert "The server is no longer open" in first.output and "revoking this one later does not open" in first.output
    second = CliRunner().invoke(cli, ["token", "create", "--scope", "ui", *db], env={"COLUMNS": "200"})
    assert "no longer open" not in second.output
    ids = [line.split()[1] for result in (first, second) for line in result.output.splitlines() if line.startswith("id:")]
    assert "No active token" not in CliRunner().invoke(cli, ["token", "revoke", ids[0], *db]).output
    last = CliRunner().invoke(cli, ["token", "revoke", ids[1], *db], env={"COLUMNS": "200"})
    assert last.exit_code == 0 and "No active token is left: the server stays closed" in last.output


def test_a_wrong_postgresql_role_is_one_line_naming_the_role_and_exit_code_3() -> None:
    from tests.conftest import pg_url

    wrong = pg_url("postgres").replace("postgres@", "no_such_role@", 1)
    done = mainspring("migrate", "--database", wrong)
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines() == [  # "migrating" is the progress line on a pipe
        "migrating the store…", f"error: store_refused: the store at {wrong.split('@')[-1]} refused the connection: "
        'role "no_such_role" does not exist']


def test_an_unreachable_database_says_at_once_how_long_it_keeps_trying_then_one_line_and_exit_code_3() -> None:
    down = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    done = mainspring("migrate", "--database", down, env={"MAINSPRING_SERVER__STARTUP_WAIT_MS": "1500"})
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    waiting = [line for line in lines if "store unavailable" in line]
    assert waiting and "retrying for up to 1.5 s (server.startup_wait_ms)" in waiting[0], lines
    assert lines[-1].startswith("error: unreachable: the store at 127.0.0.1:") and "did not answer within 1.5 s" in lines[-1], lines
    assert "Traceback" not in done.stderr


def test_a_mistyped_config_file_key_says_which_key_it_meant(tmp_path: Path) -> None:
    typo = tmp_path / "typo.toml"
    typo.write_text("[server]\nprot = 9000\n[interactions]\nlease_tiemout_ms = 1\n")
    one_line_error(mainspring("migrate", "--config", str(typo)), 2, "server.prot (did you mean server.port?)")


async def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(live_url: str, client: Any) -> None:
    for number in range(5):
        assert (await client.post("/v1/queues/mail/interactions", json={"data": number})).status_code == 201
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MAINSPRING_")}
    # `mainspring events tail | head -2`: the reader takes two lines and goes away.
    tail = await asyncio.create_subprocess_exec(sys.executable, "-m", "mainspring.cli", "events", "tail", "--url", live_url,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean)
    assert tail.stdout is not None and tail.stderr is not None
    for _ in range(2):
        assert json.loads(await asyncio.wait_for(tail.stdout.readline(), 60))["type"]
    tail.stdout.feed_eof()
    transport = tail._transport  # type: ignore[attr-defined]
    transport.get_pipe_transport(1).close()  # as `head` exits: the read end is closed
    for number in range(5, 10):  # new events make the command write into the closed pipe
        await client.post("/v1/queues/mail/interactions", json={"data": number})
    stderr = await asyncio.wait_for(tail.stderr.read(), 60)
    assert await asyncio.wait_for(tail.wait(), 60) == 0, stderr
    assert stderr == b"", stderr


async def test_the_queue_commands_pause_resume_and_change_settings_keeping_the_rest(live_url: str, client: Any) -> None:
    await client.put("/v1/queues/jobs", json={"concurrency": 3, "max_attempts": 10})
    paused = await invoke("interactions", "pause", "jobs", "--url", live_url)
    assert paused.exit_code == 0 and paused.output == "jobs paused\n", paused.output
    assert (await client.get("/v1/queues/jobs")).json()["paused"] is True
    resumed = await invoke("interactions", "resume", "jobs", "--url", live_url)
    assert resumed.exit_code == 0 and resumed.output == "jobs resumed\n", resumed.output
    assert (await client.get("/v1/queues/jobs")).json()["paused"] is False
    changed = await invoke("interactions", "settings", "jobs", "--backoff", "exponential", "--max-attempts", "4",
                           "--rate-limit", '{"count": 5, "per_ms": 1000}', "--url", live_url)
    assert changed.exit_code == 0, changed.output
    stored = (await client.get("/v1/queues/jobs")).json()
    assert (stored["backoff"], stored["max_attempts"], stored["rate_limit"], stored["concurrency"]) == \
        ("exponential", 4, {"count": 5, "per_ms": 1000}, 3)
    bad = await invoke("interactions", "settings", "jobs", "--backoff", "sometimes", "--url", live_url)
    assert bad.exit_code == 2


async def test_the_schedules_commands_put_list_and_delete_a_cron_schedule(live_url: str) -> None:
    put = await invoke("interactions", "schedules", "put", "nightly", "--cron", "0 3 * * *", "--queue", "reports",
                       "--data", '{"kind": "daily"}', "--url", live_url)
    assert put.exit_code == 0, put.output
    assert {k: json.loads(put.output)[k] for k in ("name", "cron", "queue", "data")} == \
        {"name": "nightly", "cron": "0 3 * * *", "queue": "reports", "data": {"kind": "daily"}}
    listed = await invoke("interactions", "schedules", "list", "--json", "--url", live_url)
    assert [s["name"] for s in json.loads(listed.output)] == ["nightly"]
    bad = await invoke("interactions", "schedules", "put", "broken", "--cron", "not a cron", "--queue", "reports", "--url", live_url)
    assert bad.exit_code == 1 and "error:" in bad.output
    deleted = await invoke("interactions", "schedules", "delete", "nightly", "--url", live_url)
    assert deleted.exit_code == 0 and deleted.output == "nightly deleted\n"
    assert json.loads((await invoke("interactions", "schedules", "list", "--json", "--url", live_url)).output) == []
