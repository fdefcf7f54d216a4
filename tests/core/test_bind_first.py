"""``mainspring serve`` binds its addresses first: a taken port (the main one or Machinegun's listener) fails the
start with one line and exit 3, before a store is created or recovery runs, and never after saying ready."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_cli import mainspring, one_line_error


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def store_was_created(database_url: str) -> bool:
    if database_url.startswith("sqlite"):
        return Path(database_url.split(":///", 1)[1]).exists()
    import asyncpg

    async def tables() -> int:
        conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg", "postgresql"))
        try:
            return int(await conn.fetchval("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"))
        finally:
            await conn.close()

    return asyncio.run(tables()) > 0


def test_a_taken_port_fails_the_start_before_the_store_is_created(blank_database_url: str, taken_port: int, tmp_path: Path) -> None:
    done = mainspring("serve", "--port", str(taken_port), "--database", blank_database_url, "--data-dir", str(tmp_path / "data"))
    one_line_error(done, 3, "cannot_listen", f"127.0.0.1:{taken_port}")
    assert " ready on " not in done.stdout + done.stderr
    assert not store_was_created(blank_database_url)


def test_a_taken_machinegun_listener_port_fails_the_start_before_ready(blank_database_url: str, taken_port: int, tmp_path: Path) -> None:
    from tests.conftest import free_port

    config = tmp_path / "mainspring.toml"
    config.write_text(f'[machines.machinegun]\nlisten = "127.0.0.1:{taken_port}"\nauth = "none"\n')
    done = mainspring("serve", "--config", str(config), "--port", str(free_port()), "--database", blank_database_url,
                      "--data-dir", str(tmp_path / "data"))
    one_line_error(done, 3, "cannot_listen", f"127.0.0.1:{taken_port}")
    assert " ready on " not in done.stdout + done.stderr
    assert not store_was_created(blank_database_url)
