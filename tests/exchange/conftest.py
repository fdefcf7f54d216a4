"""Exchange test fixtures: short deadlines (moved with the ManualClock) and small helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from mainspring.config import Settings, load_settings

PROCESS_TIMEOUT_MS = 10_000
COMMIT_TIMEOUT_MS = 20_000
MAILBOX = "/v1/exchange/mailboxes/mobile-a/db-1"


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 200,
                "sqlite_synchronous": "NORMAL"},
        exchange={"process_timeout_ms": PROCESS_TIMEOUT_MS, "commit_timeout_ms": COMMIT_TIMEOUT_MS,
                  "watchdog_interval_ms": 50, "cleanup_retry_ms": 1000, "cleanup_alert_after": 3,
                  "max_message_bytes": 64 * 1024},
    )


@pytest.fixture
def exchange_dir(settings: Settings) -> Path:
    return Path(settings.server.data_dir) / "exchange"


async def put(client: httpx.AsyncClient, body: bytes = b"hello", mailbox: str = MAILBOX, **headers: str) -> dict[str, Any]:
    response = await client.post(f"{mailbox}/messages", content=body, headers=headers)
    assert response.status_code in (200, 201), response.text
    return response.json()  # type: ignore[no-any-return]


async def start(client: httpx.AsyncClient, ids: list[str], mailbox: str = MAILBOX, client_id: str = "gedemin-a") -> httpx.Response:
    return await client.post(f"{mailbox}/processes", json={"client_id": client_id, "message_ids": ids})


async def listed(client: httpx.AsyncClient, mailbox: str = MAILBOX) -> dict[str, Any]:
    response = await client.get(f"{mailbox}/messages")
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def process(client: httpx.AsyncClient, pid: str) -> dict[str, Any]:
    response = await client.get(f"/v1/exchange/processes/{pid}")
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def settle(app: Any) -> None:
    """Run one watchdog round now, so tests need not wait for the loop."""
    from mainspring.exchange.watchdog import watchdog_step

    await watchdog_step(app.state.context)


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.exists() else set()
