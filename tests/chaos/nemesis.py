"""The nemesis: at random moments, one fault at a time, each healed before the next, each in the history."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.cluster import Cluster, Server
from tests.chaos.history import OK, History

FAULTS = ("kill", "pause", "drop", "stall", "disk_full", "disk_readonly", "clock_jump", "pg_restart", "pg_failover")

CLOCK_JUMP_S = (1.0, 20.0)
"""How far a server's wall clock is stepped (either way): past every lease margin and the exchange's process
timeout, so a jumped server believes live leases and processes have expired."""


PG_DATA = "MAINSPRING_CHAOS_PG_DATA"
"""The data directory of a PostgreSQL of the run's own (``MAINSPRING_TEST_PG`` pointing at it): ``pg_restart``
restarts that one with ``pg_ctl`` instead of the machine's cluster, so other users of the machine's PostgreSQL
are left alone."""


def pg_restart_command() -> list[str]:
    """A fast restart (every connection of every server cut) of the run's PostgreSQL."""
    own = os.environ.get(PG_DATA)
    if own:
        pg_ctl = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))), Path("pg_ctl"))
        # Its log in its data directory: a postmaster holding our pipes open would keep this call from returning.
        command = [str(pg_ctl), "-D", own, "-l", f"{own}/restarts.log", "-m", "fast", "-w", "restart"]
        return ["su", "postgres", "-c", " ".join(command)] if os.geteuid() == 0 else command
    clusters = os.listdir("/etc/postgresql")
    return ["pg_ctlcluster", "--skip-systemctl-redirect", clusters[0], "main", "restart"]


@dataclass
class NemesisPlan:
    interval_s: tuple[float, float] = (1.0, 3.0)
    """Quiet time between two faults (uniform)."""
    weights: dict[str, float] = field(default_factory=lambda: {"kill": 4, "pause": 2, "drop": 2, "stall": 2,
                                                               "disk_full": 1, "disk_readonly": 1,
                                                               "clock_jump": 2})
    min_kills: int = 0
    """Kill more often when behind ``min_kills`` over ``duration_s`` (the long profile's ≥ 200 kills)."""
    duration_s: float = 60.0
    pg_restart_every: int = 0
    """Restart PostgreSQL every N faults (0: never). Only with MAINSPRING_CHAOS_PG_RESTART=1: it is shared."""
    pg_failover_every: int = 0
    """Kill the HA store's primary every N faults (0: never); only when the cluster runs on an HA rig."""


class Nemesis:
    def __init__(self, cluster: Cluster, history: History, plan: NemesisPlan) -> None:
        self.cluster = cluster
        self.history = history
        self.plan = plan
        self.counts: Counter[str] = Counter()
        self.skipped: dict[str, str] = {}
        self.deadline = 0.0
        self.restarting: dict[int, asyncio.Task[None]] = {}
        if not cluster.disk.mounted:
            for kind in ("disk_full", "disk_readonly"):
                self.skipped[kind] = f"no tmpfs for the exchange dir: {cluster.disk.why_not or 'mount failed'}"
        if plan.pg_restart_every and os.environ.get("MAINSPRING_CHAOS_PG_RESTART") != "1":
            self.skipped["pg_restart"] = "MAINSPRING_CHAOS_PG_RESTART=1 not set (PostgreSQL is shared)"
        if plan.pg_restart_every and cluster.ha is not None:
            self.skipped["pg_restart"] = "the store is the HA rig, not the machine's PostgreSQL"
        if plan.pg_failover_every and cluster.ha is None:
            self.skipped["pg_failover"] = "the store is not an HA rig (run with --pg-failover)"

    async def _jump_clock(self, server: Server, hold: float, record: dict[str, object]) -> None:
        """Step one server's wall clock away and back, recording what its ``Date`` header showed meanwhile."""
        offset = random.choice((-1, 1)) * random.uniform(*CLOCK_JUMP_S)
        record["offset_s"] = round(offset, 2)
        server.clock.set(offset)
        try:
            await asyncio.sleep(max(hold, 1.5))  # the Date header is renewed once a second
            with contextlib.suppress(Exception):
                record["observed_offset_s"] = round(await server.observed_offset_s(), 1)
        finally:
            server.clock.set(0.0)

    async def _fail_over(self, record: dict[str, object]) -> None:
        """The primary's machine dies (SIGKILL of its postmaster and pg_autoctl); pg_auto_failover promotes the
        synchronous standby; the old primary comes back as the new standby, and the pair is synchronous again
        before the next fault."""
        ha = self.cluster.ha
        assert ha is not None
        killed = await ha.kill_primary()
        killed_at = time.time()
        record.update(killed_at=killed_at, killed_port=killed)
        promoted = await ha.wait_new_primary(killed)
        record.update(promoted_port=promoted, promoted_after_s=round(time.time() - killed_at, 2))
        await ha.up()
        record["synchronous_after_s"] = round(time.time() - killed_at, 2)

    async def _restart(self, server: Server) -> None:
        try:
            await asyncio.sleep(random.uniform(0, 1.0))
            with self.history.op("nemesis", "restart", str(server.index)):
                await server.restart()
        finally:
            self.restarting.pop(server.index, None)

    async def settle(self) -> None:
        """Wait for the restarts still running."""
        await asyncio.gather(*self.restarting.values(), return_exceptions=True)

    def choose(self) -> str:
        """A fault by weight, or a kill when the run is behind its kill target."""
        if self.plan.min_kills and self.deadline:
            elapsed = 1 - max(0.0, self.deadline - time.monotonic()) / self.plan.duration_s
            if self.counts["kill"] < self.plan.min_kills * elapsed:
                return "kill"
        kinds = self.kinds()
        return random.choices([k for k, _ in kinds], [w for _, w in kinds])[0]

    def kinds(self) -> list[tuple[str, float]]:
        return [(k, w) for k, w in self.plan.weights.items() if k not in self.skipped and w > 0]

    async def run(self, stop: asyncio.Event) -> None:
        self.deadline = time.monotonic() + self.plan.duration_s
        done = 0
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), random.uniform(*self.plan.interval_s))
                return
            except TimeoutError:
                pass
            done += 1
            if self.plan.pg_restart_every and "pg_restart" not in self.skipped and done % self.plan.pg_restart_every == 0:
                kind = "pg_restart"
            elif self.plan.pg_failover_every and "pg_failover" not in self.skipped and done % self.plan.pg_failover_every == 0:
                kind = "pg_failover"
            else:
                kind = self.choose()
            await self.inject(kind)

    async def inject(self, kind: str) -> None:
        try:
            await self._inject(kind)
        except Exception as exc:
            self.skipped.setdefault(f"{kind} (error)", f"{type(exc).__name__}: {exc}"[:200])

    async def _inject(self, kind: str) -> None:
        up = [s for s in self.cluster.servers if s.alive and s.index not in self.restarting]
        if kind == "kill" and len(up) < 2:
            # Keep two servers up (one may be paused next): another kind of fault instead.
            others = [(k, w) for k, w in self.kinds() if k != "kill"]
            kind = random.choices([k for k, _ in others], [w for _, w in others])[0]
        server = random.choice(up or self.cluster.servers)
        hold = random.uniform(0.5, 3.0)
        with self.history.op("nemesis", kind, str(server.index), hold_s=round(hold, 2)) as op:
            if kind == "kill":
                await server.crash()
                # Restarting takes seconds on a loaded machine: it runs beside the next faults.
                self.restarting[server.index] = asyncio.create_task(self._restart(server))
            elif kind == "pause":
                server.pause()
                await asyncio.sleep(hold)
                server.resume()
            elif kind == "drop":
                op.value["connections"] = server.proxy.drop()
            elif kind == "stall":
                await server.proxy.stall(hold)
            elif kind == "disk_full":
                await asyncio.to_thread(self.cluster.disk.fill)
                await asyncio.sleep(hold)
                self.cluster.disk.unfill()
            elif kind == "disk_readonly":
                self.cluster.disk.read_only()
                await asyncio.sleep(hold)
                self.cluster.disk.writable()
            elif kind == "clock_jump":
                await self._jump_clock(server, hold, op.value)
            elif kind == "pg_failover":
                await self._fail_over(op.value)
            elif kind == "pg_restart":
                await asyncio.to_thread(subprocess.run, pg_restart_command(), check=False, capture_output=True)
        if op.outcome == OK:
            self.counts[kind] += 1
