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
    """Run the watchdog now until nothing due is left, so tests need not wait for the loop (which may
    be running the same work at the same moment; that is allowed and ends the same)."""
    import asyncio

    from sqlalchemy import func, select

    from mainspring.exchange.tables import exchange_messages as M
    from mainspring.exchange.tables import exchange_processes as P
    from mainspring.exchange.watchdog import watchdog_step

    ctx = app.state.context
    for _ in range(100):
        await watchdog_step(ctx)
        now = ctx.store.now_ms()
        async with ctx.store.read() as conn:
            # Processes first: each statement reads its own snapshot on PostgreSQL, and a process the loop
            # turns IN_DOUBT between the two reads must not look settled with its file moves not yet seen.
            due_processes = (await conn.execute(select(func.count()).where(
                P.c.state.in_(("STARTED", "READY_TO_COMMIT")), P.c.deadline <= now))).scalar()
            due_files = (await conn.execute(select(func.count()).where(M.c.synced.is_(False), M.c.next_sync_at <= now))).scalar()
        if not due_files and not due_processes:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the watchdog did not settle")


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.exists() else set()


async def event_types(store: Any, subject_id: str) -> list[str]:
    """The event types recorded for one subject, in the order they were written."""
    from sqlalchemy import select

    from mainspring.core.tables import events

    async with store.read() as conn:
        rows = (await conn.execute(select(events.c.type).where(events.c.subject_id == subject_id).order_by(events.c.id))).all()
    return [r.type for r in rows]


async def open_alerts(store: Any, code: str | None = None) -> list[Any]:
    from sqlalchemy import select

    from mainspring.core.tables import alerts

    query = select(alerts).where(alerts.c.acked_at.is_(None))
    if code:
        query = query.where(alerts.c.code == code)
    async with store.read() as conn:
        return list((await conn.execute(query)).all())


class FailingDisk:
    """Fault injection at the seam in ``mainspring.exchange.files``: chosen disk calls raise EIO.

    Tests run as root, for whom a read-only folder is no obstacle, so the failure is injected instead.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from mainspring.exchange import files

        self._monkeypatch = monkeypatch
        self._files = files
        self._originals = {name: getattr(files, name) for name in ("_replace", "_unlink", "_fsync", "_syncfs")}
        self.calls = 0

    def fail(self, *names: str) -> None:
        import errno
        import os

        def broken(*_args: Any, **_kwargs: Any) -> None:
            self.calls += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        names = names or tuple(self._originals)
        # A disk that refuses fsync refuses syncfs too (a large batch of moves is flushed by syncfs).
        for name in {*names, *(("_syncfs",) if "_fsync" in names else ())}:
            self._monkeypatch.setattr(self._files, name, broken)

    def heal(self) -> None:
        for name, original in self._originals.items():
            self._monkeypatch.setattr(self._files, name, original)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FailingDisk:
    return FailingDisk(monkeypatch)
