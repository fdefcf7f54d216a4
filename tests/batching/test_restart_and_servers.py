"""Nothing is lost across restarts, and several servers on one database flush each task exactly once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from mainspring.api import create_app
from mainspring.store import Store
from tests.batching.conftest import claim, put_batcher, submit_pair, wait_status


async def test_restart_with_pending_tasks_and_unclaimed_packages_loses_nothing(settings, database_url, clock) -> None:
    async def running() -> Any:
        store = Store(database_url, clock=clock, pool_size=5, sqlite_synchronous="NORMAL")
        return create_app(settings, store=store)

    first = await running()
    async with first.router.lifespan_context(first):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=first), base_url="http://a") as client:
            await put_batcher(client)
            first_ids = await submit_pair(client, "1") + await submit_pair(client, "2")
            clock.advance(5000)
            first_package = (await wait_status(client, first_ids, "packed"))[0]["package_id"]
            second_ids = await submit_pair(client, "3")
            clock.advance(5000)
            second_package = (await wait_status(client, second_ids, "packed"))[0]["package_id"]
            held = await claim(client, worker="dies", lease_ms=60_000)
            pending_ids = await submit_pair(client, "4")
    assert held is not None and held["id"] == first_package

    second = await running()
    async with second.router.lifespan_context(second):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=second), base_url="http://b") as client:
            # The pending pair's timer is in the store: it ends on the new server as it would have.
            clock.advance(5000)
            late = (await wait_status(client, pending_ids, "packed"))[0]["package_id"]
            claimed = []
            while (package := await claim(client, worker="new")) is not None:
                claimed.append(package["id"])
            assert claimed == [second_package, late]
            # The package whose worker died comes back once its lease is over.
            clock.advance(60_000)
            retaken = await claim(client, worker="new", wait_ms=5000)
            assert retaken is not None and retaken["id"] == held["id"] and retaken["attempts"] == 2
            await wait_status(client, first_ids, "claimed")


def _sync_submit_all(url: str, tasks: list[dict[str, Any]]) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        for body in tasks:
            response = http.post("/v1/batchers/books/tasks", json=body)
            assert response.status_code == 202, response.text


def _submit_across(servers: list[Any], tasks: list[dict[str, Any]], lanes: int = 8) -> None:
    # Threads with sync clients: real concurrent submitters, each sticking to one server; the two books
    # of a pair go one after the other through one lane.
    pairs = [tasks[i:i + 2] for i in range(0, len(tasks), 2)]
    chunks = [[t for pair in pairs[i::lanes] for t in pair] for i in range(lanes)]
    with ThreadPoolExecutor(lanes) as pool:
        list(pool.map(lambda i: _sync_submit_all(servers[i % len(servers)].url, chunks[i]), range(lanes)))


def _wait_drained(url: str, total: int, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        batcher = httpx.get(f"{url}/v1/batchers/books").json()
        if batcher["counts"]["pending"] == 0 and batcher["counts"]["packed"] == total:
            return batcher
        assert time.monotonic() < deadline, (batcher["counts"], batcher["package_counts"], batcher["linger_ends_at"])
        time.sleep(0.1)


def _all_packages(url: str) -> list[dict[str, Any]]:
    packages: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 1000}
        if cursor:
            params["cursor"] = cursor
        page = httpx.get(f"{url}/v1/batchers/books/packages", params=params, timeout=60).json()
        packages.extend(page["packages"])
        cursor = page["next_cursor"]
        if cursor is None:
            return packages


@pytest.mark.slow
@pytest.mark.timeout(600)  # real server processes on a shared, busy machine
def test_two_servers_with_1000_tasks_pack_each_task_once_with_gapless_versions(servers) -> None:
    a, b = servers(2)
    response = httpx.put(f"{a.url}/v1/batchers/books", json={"min_size": 2, "max_size": 6, "linger_ms": 200,
                                                            "max_wait_ms": 120_000, "group_size": 2,
                                                            "incomplete_group": "carry"})
    assert response.status_code == 200
    first = [{"id": f"{g}-{m}", "group": str(g), "member": m, "content": f"{g} {m} first"}
             for g in range(400) for m in ("en", "ru")]
    second = [{"id": f"{g}-{m}-2", "group": str(g), "member": m, "content": f"{g} {m} second"}
              for g in range(100) for m in ("en", "ru")]
    _submit_across([a, b], first)
    _submit_across([a, b], second)
    _wait_drained(b.url, 1000)

    packages = _all_packages(a.url)
    task_ids = [t["id"] for p in packages for t in p["tasks"]]
    assert len(task_ids) == 1000 and len(set(task_ids)) == 1000
    assert all(1 < len(p["tasks"]) <= 6 and len(p["tasks"]) % 2 == 0 for p in packages)
    for p in packages:  # pairs travel whole, with one version
        units: dict[tuple[str, int], set[str]] = {}
        for t in p["tasks"]:
            units.setdefault((t["group"], t["version"]), set()).add(t["member"])
        assert all(members == {"en", "ru"} for members in units.values())
    for g in (0, 99, 100, 399):
        for m in ("en", "ru"):
            versions = httpx.get(f"{b.url}/v1/batchers/books/versions/{g}/{m}").json()["versions"]
            assert [v["version"] for v in versions] == ([1, 2] if g < 100 else [1])

    # Twenty claimers on both servers: every package to exactly one of them.
    def claimer(i: int) -> list[str]:
        got = []
        with httpx.Client(base_url=(a, b)[i % 2].url, timeout=60) as http:
            while True:
                r = http.post("/v1/batchers/books/packages/claim", json={"worker": f"w{i}", "wait_ms": 0})
                if r.status_code == 204:
                    return got
                got.append(r.json()["id"])

    with ThreadPoolExecutor(20) as pool:
        claimed = [pid for got in pool.map(claimer, range(20)) for pid in got]
    assert sorted(claimed) == sorted(p["id"] for p in packages)


@pytest.mark.slow
@pytest.mark.timeout(600)  # real server processes on a shared, busy machine
def test_a_server_killed_with_pending_tasks_and_packages_loses_nothing(servers, database_url) -> None:
    (server,) = servers(1)
    httpx.put(f"{server.url}/v1/batchers/kept", json={"max_size": 2}).raise_for_status()
    httpx.put(f"{server.url}/v1/batchers/books", json={"linger_ms": 1500}).raise_for_status()
    for g in range(3):
        for m in ("en", "ru"):
            r = httpx.post(f"{server.url}/v1/batchers/kept/tasks", json={"id": f"{g}-{m}", "group": str(g), "member": m, "content": m})
            assert r.status_code == 202
    for m in ("en", "ru"):
        r = httpx.post(f"{server.url}/v1/batchers/books/tasks", json={"id": f"p-{m}", "group": "p", "member": m, "content": m})
        assert r.status_code == 202
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/v1/batchers/kept").json()["package_counts"]["ready"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    held = httpx.post(f"{server.url}/v1/batchers/kept/packages/claim", json={"worker": "dies", "lease_ms": 1000}).json()
    server.kill()

    (restarted,) = servers(1)
    deadline = time.monotonic() + 15
    while {httpx.get(f"{restarted.url}/v1/batchers/books/tasks/p-{m}").json()["status"] for m in ("en", "ru")} != {"packed"}:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    claimed = []
    while (r := httpx.post(f"{restarted.url}/v1/batchers/kept/packages/claim", json={"worker": "new", "wait_ms": 3000})).status_code == 200:
        claimed.append(r.json()["id"])
    assert len(claimed) == 3 and held["id"] in claimed
