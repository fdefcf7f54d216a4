from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx


async def run_of(client: httpx.AsyncClient, name: str, run_id: str) -> dict[str, Any]:
    answer = await client.get(f"/v1/workflows/{name}/runs/{run_id}")
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


async def until_status(client: httpx.AsyncClient, name: str, run_id: str, *statuses: str, within_s: float = 20) -> dict[str, Any]:
    """The run once its status is one of ``statuses`` (real time: the loops run on their own)."""
    deadline = time.monotonic() + within_s
    while True:
        run = await run_of(client, name, run_id)
        if run["status"] in statuses:
            return run
        if time.monotonic() > deadline:
            machine = (await client.get(f"/v1/namespaces/{name}/machines/{run_id}")).json()
            raise AssertionError(f"run {name}/{run_id} is {run['status']}, not {statuses}: {run}; its machine: {machine}")
        await asyncio.sleep(0.02)


async def finished(client: httpx.AsyncClient, name: str, run_id: str, within_s: float = 20) -> dict[str, Any]:
    return await until_status(client, name, run_id, "completed", "failed", "cancelled", within_s=within_s)
