"""A PostgreSQL failover under two servers' light load: the primary's machine dies (SIGKILL of its postmaster
and pg_autoctl), pg_auto_failover promotes the synchronous standby, and every write a server acknowledged —
before, during or after — is found on the new primary. In between the servers answer ``503 unavailable``
with Retry-After, never 500, and afterwards each has reconnected on its own: the pool, the LISTEN connection,
the events sequencer.

Needs Debian's pg_auto_failover (``scripts/ha-postgres`` installs it when it can; skipped where it cannot)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from mainspring.store import Store
from mainspring.store.engine import LISTEN_APPLICATION_NAME
from mainspring.store.replication import why_not_synchronous
from tests.chaos.ha import HaPostgres, HaUnavailable
from tests.conftest import ServerProcess, _migrate, eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

QUEUE = "failover"
BATCHER = "failover"


@pytest.fixture
async def rig() -> AsyncIterator[HaPostgres]:
    ha = HaPostgres()
    try:
        await ha.up()
    except HaUnavailable as exc:
        await ha.down()
        pytest.skip(f"no pg_auto_failover here: {exc}")
    try:
        yield ha
    finally:
        await ha.down()


@dataclass
class Load:
    """What the clients sent and what they were told, per write."""

    acked_interactions: dict[str, str] = field(default_factory=dict)
    """message_id → interaction id."""
    acked_tasks: dict[str, str] = field(default_factory=dict)
    acked_completions: set[str] = field(default_factory=set)
    statuses: dict[int, int] = field(default_factory=dict)
    unavailable_without_retry_after: int = 0
    acked_after: dict[str, float] = field(default_factory=dict)
    """Per server: when it first acknowledged a write that was sent after the kill."""

    def saw(self, answer: httpx.Response) -> None:
        self.statuses[answer.status_code] = self.statuses.get(answer.status_code, 0) + 1
        if answer.status_code == 503 and (
            answer.headers.get("retry-after") != "1" or answer.json().get("code") != "unavailable"
        ):
            self.unavailable_without_retry_after += 1


async def produce(client: httpx.AsyncClient, name: str, load: Load, stop: asyncio.Event, killed: list[float]) -> None:
    """Create interactions and submit batching tasks, each key until it is acknowledged (as a careful client
    retries an unknown outcome with the same key)."""
    for n in itertools.count():
        if stop.is_set():
            return
        key = f"{name}-{n}"
        for path, body, acked in (
            (f"/v1/queues/{QUEUE}/interactions", {"message_id": key, "data": {"n": n}}, load.acked_interactions),
            (f"/v1/batchers/{BATCHER}/tasks", {"id": key, "group": key, "member": "m", "content": key}, load.acked_tasks),
        ):
            while not stop.is_set():
                sent_at = time.monotonic()
                try:
                    answer = await client.post(path, json=body)
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
                    continue
                load.saw(answer)
                if answer.status_code in (200, 201, 202):
                    acked[key] = answer.json()["id"]
                    if killed and sent_at > killed[0]:
                        load.acked_after.setdefault(name, time.monotonic())
                    break
                await asyncio.sleep(0.1)
        await asyncio.sleep(0.05)


async def work(client: httpx.AsyncClient, load: Load, stop: asyncio.Event) -> None:
    """Lease interactions and complete them, fenced by the lease token."""
    while not stop.is_set():
        try:
            answer = await client.post(f"/v1/queues/{QUEUE}/lease", json={"worker": "w", "max": 5, "wait_ms": 200})
            load.saw(answer)
            if answer.status_code != 200:
                await asyncio.sleep(0.1)
                continue
            for item in answer.json()["interactions"]:
                done = await client.post(
                    f"/v1/interactions/{item['id']}/release",
                    json={"token": item["lease"]["token"], "outcome": {"complete": {"result": None}}},
                )
                load.saw(done)
                if done.status_code == 200:
                    load.acked_completions.add(item["id"])
        except httpx.TransportError:
            await asyncio.sleep(0.1)


async def test_a_failover_under_load_from_two_servers_loses_nothing_acknowledged(rig: HaPostgres, tmp_path: Path) -> None:
    await asyncio.to_thread(_migrate, rig.url)
    env = {
        "MAINSPRING_SERVER__REQUIRE_SYNC_REPLICA": "true",
        "MAINSPRING_SERVER__POOL_SIZE": "4",
        "MAINSPRING_SERVER__STARTUP_WAIT_MS": "120000",
    }
    servers = [ServerProcess(rig.url, tmp_path / "data", env).start(wait=False) for _ in range(2)]
    load = Load()
    stop = asyncio.Event()
    killed: list[float] = []
    try:
        for server in servers:
            await asyncio.to_thread(server.wait_ready, 120)
        clients = [httpx.AsyncClient(base_url=s.url, timeout=30) for s in servers]
        async with contextlib.AsyncExitStack() as stack:
            for client in clients:
                await stack.enter_async_context(client)
            assert (await clients[0].put(f"/v1/batchers/{BATCHER}", json={"min_size": 1, "max_size": 10, "linger_ms": 100, "max_wait_ms": 500, "group_size": 1})).status_code == 200
            tasks = [asyncio.create_task(produce(c, f"s{i}", load, stop, killed)) for i, c in enumerate(clients)]
            tasks.append(asyncio.create_task(work(clients[1], load, stop)))
            await eventually(lambda: _async(len(load.acked_interactions) >= 10), 60, "writes before the kill")

            old_primary = await rig.kill_primary()
            killed.append(time.monotonic())
            new_primary = await rig.wait_new_primary(old_primary)
            # Both servers write again on their own: each acknowledges a write sent after the kill.
            await eventually(lambda: _async(len(load.acked_after) == 2), 120, "both servers writing after the failover")
            # Alone, the new primary commits without a standby (pg_auto_failover's wait_primary): said so.
            assert "synchronous_standby_names is empty" in str(await _why_not_synchronous(rig.url))
            await rig.up()  # the old primary comes back as the new standby; the pair is synchronous again
            assert await _why_not_synchronous(rig.url) is None
            acked_before_stop = len(load.acked_interactions)
            await eventually(lambda: _async(len(load.acked_interactions) >= acked_before_stop + 10), 60, "writes with the pair whole again")
            stop.set()
            await asyncio.gather(*tasks)

            # Every acknowledged write is on the new primary: read back through both servers.
            for n, key in enumerate(sorted(load.acked_interactions)):
                found = await clients[n % 2].get(f"/v1/queues/{QUEUE}/interactions", params={"message_id": key})
                assert found.status_code == 200 and len(found.json()["interactions"]) == 1, (key, found.text)
            for n, key in enumerate(sorted(load.acked_tasks)):
                found = await clients[n % 2].get(f"/v1/batchers/{BATCHER}/tasks/{key}")
                assert found.status_code == 200, (key, found.text)
            for n, item_id in enumerate(sorted(load.acked_completions)):
                found = await clients[n % 2].get(f"/v1/interactions/{item_id}")
                assert found.json()["status"] == "completed", found.text

            # Never a 500, and every 503 said when to come back.
            assert not [s for s in load.statuses if s >= 500 and s != 503], load.statuses
            assert load.unavailable_without_retry_after == 0
            assert load.statuses.get(503, 0) > 0, "the failover was never seen by a client"

            # The events sequencer runs on the new primary: every acknowledged creation's event is numbered.
            ids = set(load.acked_interactions.values())
            await eventually(lambda: _events_cover(clients[0], ids), 60, "events numbered after the failover")

        # Each server's LISTEN connection is on the new primary, and neither server logged a traceback.
        await eventually(
            lambda: _listeners_on(rig, new_primary, 2), 30, "both servers LISTENing on the new primary"
        )
        for server in servers:
            log = server.log()
            assert "Traceback" not in log, log[-3000:]
            assert "require_sync_replica" not in log, "warned at start although the pair was synchronous"
    finally:
        stop.set()
        for server in servers:
            server.kill()


async def _why_not_synchronous(url: str) -> str | None:
    store = Store(url, pool_size=1)
    try:
        return await why_not_synchronous(store)
    finally:
        await store.close()


async def _async(value: bool) -> bool:
    return value


async def _events_cover(client: httpx.AsyncClient, ids: set[str]) -> bool:
    seen: set[str] = set()
    cursor = "0"
    while True:
        page = await client.get("/v1/events", params={"after": cursor, "types": "interaction.created", "limit": 1000})
        if page.status_code != 200:
            return False
        body = page.json()
        seen.update(e["subject"]["id"] for e in body["events"])
        if not body["events"] or body["next_cursor"] in (None, cursor):
            break
        cursor = body["next_cursor"]
    return ids <= seen


async def _listeners_on(rig: HaPostgres, port: int, count: int) -> bool:
    rows = await rig.fetch(
        f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{LISTEN_APPLICATION_NAME}'", port
    )
    return int(rows[0][0]) == count
