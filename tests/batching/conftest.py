"""Helpers for the batching tests: short settings, submitting pairs, waiting for the dispatcher."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from mainspring.config import Settings, load_settings
from mainspring.core import outbox
from mainspring.store import Store
from tests.conftest import eventually

SEED_RULES = {"min_size": 2, "max_size": 6, "linger_ms": 5000, "max_wait_ms": 30000, "group_size": 2,
              "incomplete_group": "reject", "lease_ms": 10000}


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 100, "sqlite_synchronous": "NORMAL"},
        batching={"worker_poll_ms": 100},
    )



async def settle(seconds: float = 0.3) -> None:
    """Give the background loops time to act when a test proves that nothing happens."""
    await asyncio.sleep(seconds)


async def put_batcher(client: httpx.AsyncClient, name: str = "books", **changes: Any) -> dict[str, Any]:
    response = await client.put(f"/v1/batchers/{name}", json={**SEED_RULES, **changes})
    assert response.status_code == 200, response.text
    return response.json()


async def submit(client: httpx.AsyncClient, task_id: str, group: str, member: str, content: Any = None,
                 name: str = "books", expect: int = 202) -> dict[str, Any]:
    body = {"id": task_id, "group": group, "member": member,
            "content": content if content is not None else f"text of {group} in {member}"}
    response = await client.post(f"/v1/batchers/{name}/tasks", json=body)
    assert response.status_code == expect, response.text
    return response.json()


async def submit_pair(client: httpx.AsyncClient, book: str, name: str = "books", content: str = "") -> list[str]:
    ids = []
    for member in ("en", "ru"):
        task = await submit(client, f"{book}-{member}", book, member, f"{book} in {member} {content}", name=name)
        ids.append(task["id"])
    return ids


async def task(client: httpx.AsyncClient, task_id: str, name: str = "books") -> dict[str, Any]:
    response = await client.get(f"/v1/batchers/{name}/tasks/{task_id}")
    assert response.status_code == 200, response.text
    return response.json()


async def statuses(client: httpx.AsyncClient, ids: list[str], name: str = "books") -> dict[str, str]:
    return {i: (await task(client, i, name))["status"] for i in ids}


async def wait_status(client: httpx.AsyncClient, ids: list[str], status: str, name: str = "books",
                      within_s: float = 10.0) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]] | None:
        tasks = [await task(client, i, name) for i in ids]
        return tasks if all(t["status"] == status for t in tasks) else None

    return await eventually(check, within_s, f"{ids} to be {status}")  # type: ignore[no-any-return]


async def claim(client: httpx.AsyncClient, name: str = "books", worker: str = "w1", **extra: Any) -> dict[str, Any] | None:
    response = await client.post(f"/v1/batchers/{name}/packages/claim", json={"worker": worker, **extra})
    assert response.status_code in (200, 204), response.text
    return response.json() if response.status_code == 200 else None


async def events(client: httpx.AsyncClient, types: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    after = "0"
    while True:
        response = await client.get("/v1/events", params={"after": after, "types": types, "limit": 1000})
        assert response.status_code == 200, response.text
        page = response.json()
        found.extend(page["events"])
        if not page["events"]:
            return found
        after = page["next_cursor"]


@pytest.fixture
def batch_events(client: httpx.AsyncClient, store: Store) -> Callable[[str], Awaitable[list[dict[str, Any]]]]:
    """Read events of ``types``; on PostgreSQL the committed ones are numbered first (the sequencer's job)."""

    async def read(types: str) -> list[dict[str, Any]]:
        await outbox.wait_numbered(store)
        return await events(client, types)

    return read
