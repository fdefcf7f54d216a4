"""The parties of a chaos run: a fresh PostgreSQL database, N ``mainspring serve`` processes sharing it and
one data dir (the exchange's files on a small tmpfs the nemesis can fill or make read-only), a proxy in front
of each server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpx

from tests.chaos.flowapp import CALLS_FILE, calls_path
from tests.chaos.ha import HaPostgres
from tests.chaos.proxy import Proxy
from tests.conftest import ServerProcess, _migrate, _pg_admin, pg_url

# Short deadlines, so that "never stuck" is checked within seconds of the last fault.
SERVER_ENV = {
    "MAINSPRING_SERVER__POLL_INTERVAL_MS": "200",
    "MAINSPRING_SERVER__POOL_SIZE": "8",
    "MAINSPRING_SERVER__GRACEFUL_SHUTDOWN_MS": "1000",
    "MAINSPRING_EXCHANGE__PROCESS_TIMEOUT_MS": "15000",
    "MAINSPRING_EXCHANGE__COMMIT_TIMEOUT_MS": "15000",
    "MAINSPRING_EXCHANGE__WATCHDOG_INTERVAL_MS": "250",
    "MAINSPRING_EXCHANGE__CLEANUP_RETRY_MS": "250",
    "MAINSPRING_EXCHANGE__CLEANUP_RETRY_MAX_MS": "2000",
    "MAINSPRING_MACHINES__LEASE_MARGIN_MS": "1000",
    "MAINSPRING_INTERACTIONS__EXPIRY_INTERVAL_MS": "250",
    # A killed server's runs go to the others this long after its last write. Long enough that a live server
    # starved on a loaded machine keeps its runs (3 s was not, at load 30: a third server took a step over
    # twice), short enough for the drain.
    "MAINSPRING_WORKFLOWS__LEASE_MS": "10000",
}
APP = "tests.chaos.flowapp:app"
"""Every server runs the workflows workload's workflow."""
HA_SERVER_ENV = {
    # A server restarted while no primary is up says so; the runs' logs show when that happened.
    "MAINSPRING_SERVER__REQUIRE_SYNC_REPLICA": "true",
}


class Disk:
    """The exchange's file directory on its own small tmpfs (when this host lets us mount one)."""

    def __init__(self, path: Path, size_mb: int = 64) -> None:
        self.path = path
        self.size_mb = size_mb
        self.mounted = False
        self.why_not = ""

    def mount(self) -> bool:
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path)],
                              capture_output=True, text=True, check=False)
        self.mounted = done.returncode == 0
        self.why_not = done.stderr.strip()
        return self.mounted

    def _remount(self, mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.path)], capture_output=True, check=False)

    def read_only(self) -> None:
        self._remount("ro")

    def writable(self) -> None:
        self._remount("rw")

    def fill(self) -> None:
        """Fill the file system to the last byte (root ignores permissions, not ENOSPC)."""
        with contextlib.suppress(OSError), (self.path / ".chaos-filler").open("wb") as f:
            chunk = b"\0" * (1 << 20)
            while True:
                f.write(chunk)
                f.flush()

    def unfill(self) -> None:
        with contextlib.suppress(OSError):
            (self.path / ".chaos-filler").unlink()

    def unmount(self) -> None:
        if self.mounted:
            self.writable()
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
            self.mounted = False


class Clock:
    """One server's wall clock, stepped through a file its process reads (``tests/chaos/skew/sitecustomize.py``
    on its ``PYTHONPATH``); the harness and the other servers keep the true time."""

    SKEW_DIR = Path(__file__).parent / "skew"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset_s = 0.0
        self.set(0.0)

    def env(self) -> dict[str, str]:
        python_path = os.pathsep.join(p for p in (str(self.SKEW_DIR), os.environ.get("PYTHONPATH", "")) if p)
        return {"PYTHONPATH": python_path, "MAINSPRING_CHAOS_CLOCK_FILE": str(self.path)}

    def set(self, offset_s: float) -> None:
        """Step the clock to ``offset_s`` seconds from the true time (atomically: the server may read the file
        at any moment)."""
        temp = self.path.with_suffix(".tmp")
        temp.write_text(f"{offset_s:+.3f}\n")
        temp.replace(self.path)
        self.offset_s = offset_s


class Server:
    """One ``mainspring serve`` with its proxy and its own clock; it keeps its port across restarts."""

    def __init__(self, index: int, process: ServerProcess, proxy: Proxy, clock: Clock) -> None:
        self.index = index
        self.process = process
        self.proxy = proxy
        self.clock = clock
        self.paused = False

    @property
    def alive(self) -> bool:
        return self.process.proc is not None and self.process.proc.poll() is None

    def kill(self) -> None:
        self.process.kill()
        self.paused = False

    async def crash(self) -> None:
        """SIGKILL without blocking the event loop while the kernel reaps it; its proxy refuses connections
        until it is back."""
        proc = self.process.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            await asyncio.to_thread(proc.wait, 30)
        self.paused = False
        await self.proxy.unlisten()

    async def restart(self, ready_within_s: float = 180) -> None:
        self.process.start(wait=False)
        try:
            await asyncio.to_thread(self.process.wait_ready, ready_within_s)
        finally:
            await self.proxy.listen()

    async def observed_offset_s(self) -> float:
        """How far the server's wall clock is from ours, read from its ``Date`` header (1 s resolution)."""
        async with httpx.AsyncClient(timeout=2) as client:
            answer = await client.get(self.process.url + "/healthz")
        return parsedate_to_datetime(answer.headers["date"]).timestamp() - time.time()

    def pause(self) -> None:
        if self.alive:
            os.kill(self.process.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
            self.paused = True

    def resume(self) -> None:
        if self.alive and self.paused:
            os.kill(self.process.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        self.paused = False


class Cluster:
    """``ha``: run on that highly available PostgreSQL (its multi-host URL) instead of the machine's own."""

    def __init__(self, workdir: Path, servers: int = 3, env: dict[str, str] | None = None,
                 ha: HaPostgres | None = None) -> None:
        self.workdir = workdir
        self.count = servers
        self.ha = ha
        self.env = {**SERVER_ENV, **(HA_SERVER_ENV if ha else {}), CALLS_FILE: str(calls_path(workdir)), **(env or {})}
        self.database = f"mschaos_{uuid.uuid4().hex[:10]}"
        self.database_url = ha.database_url(self.database) if ha else pg_url(self.database)
        self.data_dir = workdir / "data"
        self.disk = Disk(self.data_dir / "exchange")
        self.servers: list[Server] = []

    async def start(self) -> Cluster:
        await self._admin(f'CREATE DATABASE "{self.database}"')
        await asyncio.to_thread(_migrate, self.database_url)
        self.disk.mount()
        for index in range(self.count):
            clock = Clock(self.workdir / f"clock-{index}.faketime")
            process = ServerProcess(self.database_url, self.data_dir, {**self.env, **clock.env()}, args=["--app", APP])
            process.log_path = self.workdir / f"server-{index}.log"
            proxy = await Proxy(process.port).start()
            self.servers.append(Server(index, process, proxy, clock))
        for server in self.servers:
            server.process.start(wait=False)
        for server in self.servers:
            await asyncio.to_thread(server.process.wait_ready, 180)
        return self

    async def _admin(self, statement: str) -> None:
        if self.ha is not None:
            await self.ha.admin(statement)
        else:
            await _pg_admin(statement)

    async def heal(self) -> None:
        """End every fault: resume, restart the dead, clocks back to true time (stalls end by themselves); an
        HA store gets its primary + synchronous standby back."""
        if self.ha is not None:
            await self.ha.up()
        self.disk.unfill()
        self.disk.writable()
        for server in self.servers:
            server.resume()
            server.clock.set(0.0)
        for server in self.servers:
            if not server.alive:
                await server.restart()
            else:
                await asyncio.to_thread(server.process.wait_ready, 180)
                await server.proxy.listen()

    async def stop(self, drop_database: bool = True) -> None:
        for server in self.servers:
            server.resume()
            server.kill()
            await server.proxy.close()
        self.disk.unmount()
        if drop_database:
            deadline = time.monotonic() + 10
            while True:
                try:
                    await self._admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
