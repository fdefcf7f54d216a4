"""SIGKILL of a real ``mainspring serve`` with a process in each state, then a restart: the end state is
the one API.md's start-up rules give, and nothing is lost."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

MAILBOX = "/v1/exchange/mailboxes/mobile-a/db-1"
PR = "/v1/exchange/processes"
LONG = {"MAINSPRING_EXCHANGE__PROCESS_TIMEOUT_MS": "600000", "MAINSPRING_EXCHANGE__COMMIT_TIMEOUT_MS": "600000"}
SHORT = {"MAINSPRING_EXCHANGE__PROCESS_TIMEOUT_MS": "300", "MAINSPRING_EXCHANGE__COMMIT_TIMEOUT_MS": "300",
         "MAINSPRING_EXCHANGE__WATCHDOG_INTERVAL_MS": "50"}


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def wait_for_state(url: str, pid: str, state: str, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = httpx.get(f"{url}{PR}/{pid}").json()
        if body.get("state") == state:
            return body
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never reached {state}: {body}")


def begin(url: str, n: int = 2) -> tuple[list[str], str]:
    ids = [httpx.post(f"{url}{MAILBOX}/messages", content=f"body-{i}".encode()).json()["id"] for i in range(n)]
    response = httpx.post(f"{url}{MAILBOX}/processes", json={"client_id": "gedemin", "message_ids": ids})
    assert response.status_code == 201, response.text
    return ids, response.json()["id"]


def available(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(f"{url}{MAILBOX}/messages").json()["messages"]]


def restart(servers, server, env: dict[str, str] = LONG):
    server.kill()
    return servers(1, env=env, data_dir=server.data_dir)[0]


def test_sigkill_with_a_started_process_keeps_it_started_with_its_deadline(servers):
    (server,) = servers(1, env=LONG)
    _ids, pid = begin(server.url)
    before = httpx.get(f"{server.url}{PR}/{pid}").json()
    after_restart = restart(servers, server)
    after = httpx.get(f"{after_restart.url}{PR}/{pid}").json()
    assert after["state"] == "STARTED" and after["deadline"] == before["deadline"]
    assert available(after_restart.url) == []
    assert httpx.post(f"{after_restart.url}{PR}/{pid}/ready").json()["status"] == "OK"
    assert httpx.post(f"{after_restart.url}{PR}/{pid}/committed").json()["state"] == "DONE"


def test_sigkill_with_a_ready_to_commit_process_makes_it_in_doubt_with_an_alert(servers):
    (server,) = servers(1, env=LONG)
    ids, pid = begin(server.url)
    httpx.post(f"{server.url}{PR}/{pid}/ready", json={"replies": [{"addressee": "mobile-b", "database": "db-1", "body": "r"}]})
    new = restart(servers, server)
    assert httpx.get(f"{new.url}{PR}/{pid}").json()["state"] == "IN_DOUBT"
    root = server.data_dir / "exchange"
    assert files_under(root / "unknown") == {f"{pid}/{i}" for i in ids}
    alerts = httpx.get(f"{new.url}/v1/alerts", params={"open": "true"}).json()["alerts"]
    assert [a["subject"]["id"] for a in alerts if a["code"] == "exchange_in_doubt"] == [pid]
    assert available(new.url) == []
    assert httpx.post(f"{new.url}{PR}/{pid}/committed").json()["state"] == "DONE"
    assert [m["size"] for m in httpx.get(f"{new.url}/v1/exchange/mailboxes/mobile-b/db-1/messages").json()["messages"]] == [1]


def test_sigkill_with_a_cleanup_process_finishes_it_at_restart(servers):
    (server,) = servers(1, env=LONG)
    ids, pid = begin(server.url, 1)
    httpx.post(f"{server.url}{PR}/{pid}/ready")
    # A delete the disk refuses, even to root: the file's name now holds a non-empty folder.
    path = server.data_dir / "exchange" / "mailboxes" / "mobile-a" / "db-1" / ids[0]
    path.unlink()
    (path / "stuck").mkdir(parents=True)
    assert httpx.post(f"{server.url}{PR}/{pid}/committed").json()["state"] == "CLEANUP"
    server.kill()
    shutil.rmtree(path)
    new = servers(1, env=LONG, data_dir=server.data_dir)[0]
    assert httpx.get(f"{new.url}{PR}/{pid}").json()["state"] == "DONE"
    assert available(new.url) == []


def test_sigkill_with_a_cancelled_process_drops_it_at_restart(servers):
    (server,) = servers(1, env=SHORT)
    ids, pid = begin(server.url)
    wait_for_state(server.url, pid, "CANCELLED")
    new = restart(servers, server)
    response = httpx.get(f"{new.url}{PR}/{pid}")
    assert response.status_code == 404 and response.json()["code"] == "process_not_found"
    assert available(new.url) == ids


def test_sigkill_with_an_in_doubt_process_keeps_it_resolvable(servers):
    (server,) = servers(1, env={**SHORT, "MAINSPRING_EXCHANGE__PROCESS_TIMEOUT_MS": "60000"})
    ids, pid = begin(server.url)
    assert httpx.post(f"{server.url}{PR}/{pid}/ready").status_code == 200
    wait_for_state(server.url, pid, "IN_DOUBT")
    new = restart(servers, server)
    assert httpx.get(f"{new.url}{PR}/{pid}").json()["state"] == "IN_DOUBT"
    assert httpx.post(f"{new.url}{PR}/{pid}/commit-failed").json()["state"] == "ABORTED"
    assert available(new.url) == ids
    assert files_under(server.data_dir / "exchange" / "unknown") == set()


@pytest.mark.parametrize("ending", ["committed", "commit-failed"])
def test_sigkill_after_a_finished_process_changes_nothing(servers, ending):
    (server,) = servers(1, env=LONG)
    ids, pid = begin(server.url)
    httpx.post(f"{server.url}{PR}/{pid}/ready")
    final = httpx.post(f"{server.url}{PR}/{pid}/{ending}").json()
    new = restart(servers, server)
    assert httpx.get(f"{new.url}{PR}/{pid}").json()["state"] == final["state"]
    assert available(new.url) == ([] if ending == "committed" else ids)


def test_fifty_concurrent_starts_across_two_servers_give_exactly_one_201(servers):
    import concurrent.futures

    first, second = servers(2, env=LONG)
    ids = [httpx.post(f"{first.url}{MAILBOX}/messages", content=b"x").json()["id"] for _ in range(3)]

    def attempt(i: int) -> httpx.Response:
        url = (first, second)[i % 2].url
        return httpx.post(f"{url}{MAILBOX}/processes", json={"client_id": f"g{i}", "message_ids": ids}, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        responses = list(pool.map(attempt, range(50)))
    assert sum(r.status_code == 201 for r in responses) == 1
    assert all(r.status_code == 409 for r in responses if r.status_code != 201)
