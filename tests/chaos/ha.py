"""A highly available PostgreSQL of its own (``scripts/ha-postgres``) for a test or a chaos run: a
pg_auto_failover monitor and two data nodes on free ports, in a fresh directory, removed again by ``down``."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import asyncpg

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ha-postgres"
CANNOT_INSTALL = 3
"""``scripts/ha-postgres`` exits with this when pg_auto_failover is missing and cannot be installed here."""


class HaUnavailable(RuntimeError):
    """pg_auto_failover is not installed and this machine cannot install it."""


def _free_port_run(length: int = 3) -> int:
    """A base port such that it and the next ``length - 1`` are free on 127.0.0.1."""
    for _ in range(200):
        base = random.randrange(20_000, 40_000)
        try:
            for port in range(base, base + length):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no three free ports in a row")


class HaPostgres:
    """One rig: ``up`` (create or bring back what is down, wait for primary + secondary), ``kill_primary``,
    ``failover``, ``down``."""

    def __init__(self, directory: Path | None = None, base_port: int | None = None, wait_s: int = 180) -> None:
        # Not under pytest's tmp_path: as root the servers run as `postgres`, which cannot enter it.
        self.directory = directory or Path(tempfile.mkdtemp(prefix="mainspring-ha-"))
        self.base_port = base_port or _free_port_run()
        self.env = {
            **os.environ,
            "HA_POSTGRES_DIR": str(self.directory),
            "HA_POSTGRES_PORT": str(self.base_port),
            "HA_POSTGRES_WAIT": str(wait_s),
        }
        self.url = self._run("url").strip()
        """The multi-host URL of the rig's ``mainspring`` database."""
        self.node_ports = [self.base_port + 1, self.base_port + 2]

    def _run(self, *args: str) -> str:
        done = subprocess.run([str(SCRIPT), *args], env=self.env, capture_output=True, text=True, check=False)
        if done.returncode == CANNOT_INSTALL:
            raise HaUnavailable(done.stderr.strip())
        if done.returncode != 0:
            raise RuntimeError(f"scripts/ha-postgres {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return done.stdout

    async def up(self) -> HaPostgres:
        await asyncio.to_thread(self._run, "up")
        return self

    async def down(self, keep_logs: Path | None = None) -> None:
        """Stop everything and delete the directory (its logs copied to ``keep_logs`` first, if given)."""
        if keep_logs is not None:
            await asyncio.to_thread(self._copy_logs, keep_logs)
        await asyncio.to_thread(self._run, "down")

    def _copy_logs(self, to: Path) -> None:
        if self.directory.exists():
            to.mkdir(parents=True, exist_ok=True)
            for log in self.directory.glob("*.log"):
                shutil.copy(log, to / log.name)

    async def kill_primary(self) -> int:
        """SIGKILL the primary's postmaster and pg_autoctl; answers the killed node's port."""
        return int((await asyncio.to_thread(self._run, "kill-primary")).strip())

    async def failover(self) -> None:
        await asyncio.to_thread(self._run, "failover")

    async def primary_port(self) -> int | None:
        out = (await asyncio.to_thread(self._run, "primary")).strip()
        return int(out) if out else None

    async def wait_new_primary(self, old_port: int, within_s: float = 120) -> int:
        """Wait until the monitor has promoted a node other than ``old_port``; answers its port."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            port = await self.primary_port()
            if port is not None and port != old_port:
                return port
            await asyncio.sleep(0.2)
        raise TimeoutError(f"no node was promoted within {within_s} s of losing {old_port}")

    def database_url(self, database: str) -> str:
        """The multi-host URL of ``database`` on the pair."""
        return self.url.replace("/mainspring?", f"/{database}?")

    def node_url(self, port: int, database: str = "mainspring") -> str:
        return f"{self.url.split('@', 1)[0]}@127.0.0.1:{port}/{database}"

    async def admin(self, *statements: str, database: str = "postgres") -> None:
        """Run statements on the current primary (creating or dropping databases)."""
        conn = await asyncpg.connect(self.database_url(database))
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    async def fetch(self, query: str, port: int | None = None, database: str = "mainspring") -> list[asyncpg.Record]:
        """``query`` on one node (the primary when ``port`` is None)."""
        dsn = self.node_url(port, database) if port else self.database_url(database)
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(query)
        finally:
            await conn.close()
