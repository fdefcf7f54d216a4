"""One chaos run: cluster up, workloads and nemesis for a while, heal, drain, read back, check.

```python
result = asyncio.run(run(SHORT, Path("/tmp/chaos")))
assert result.violations == []
```
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.checker import FinalState, Violation, check
from tests.chaos.cluster import Cluster
from tests.chaos.ha import HaPostgres
from tests.chaos.history import OK, History, Op, summarize, verdicts
from tests.chaos.nemesis import Nemesis, NemesisPlan
from tests.chaos.workloads import ALL, Workload

log = logging.getLogger("mainspring.chaos")


@dataclass
class Profile:
    name: str
    duration_s: float
    """How long the workloads and the nemesis run."""
    drain_s: float = 60.0
    """After the last fault: how long everything may take to finish (the checker then calls the rest stuck)."""
    servers: int = 3
    rate: float = 4.0
    """New operations per second, per face."""
    nemesis: NemesisPlan = field(default_factory=NemesisPlan)
    ha: bool = False
    """Run on a highly available PostgreSQL of the run's own (``scripts/ha-postgres``), not the machine's."""


SHORT = Profile("short", duration_s=45, drain_s=45, rate=3.0,
                nemesis=NemesisPlan(interval_s=(1.0, 2.5), duration_s=45, min_kills=3))


def long_profile(minutes: float, kills: int, pg_restart_every: int = 0, pg_failover_every: int = 0) -> Profile:
    """``pg_restart_every``: every N-th fault restarts PostgreSQL (0: never); ``pg_failover_every``: every N-th
    fault kills the primary of an HA PostgreSQL the run brings up for itself (0: no HA store)."""
    duration = minutes * 60
    return Profile("long", duration_s=duration, drain_s=120, rate=4.0, ha=pg_failover_every > 0,
                   nemesis=NemesisPlan(interval_s=(1.0, 4.0), duration_s=duration, min_kills=kills,
                                       pg_restart_every=pg_restart_every, pg_failover_every=pg_failover_every))


@dataclass
class Result:
    profile: str
    duration_s: float
    drain_s: float
    wall_s: float
    """From the first server's start to the checked result."""
    faults: dict[str, int]
    skipped_faults: dict[str, str]
    operations: dict[str, dict[str, int]]
    operation_count: int
    keys: dict[str, dict[str, int]]
    """Per face.kind: how many distinct operations (keys) ended ok / fail / unknown over all their attempts."""
    restarts: dict[str, int]
    violations: list[str]
    outstanding_after_drain: int
    workdir: str
    failovers: list[dict[str, Any]] = field(default_factory=list)
    """Per PostgreSQL failover: seconds from the primary's kill to the promotion, to the first acknowledged
    write sent after the kill, and to the pair being synchronous again."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


async def _drain(workloads: list[Workload], limit_s: float) -> int:
    """Wait until nothing is left to do (or ``limit_s``); answers what was still left."""
    deadline = time.monotonic() + limit_s
    left = -1
    while time.monotonic() < deadline:
        try:
            each = {w.face: await w.outstanding() for w in workloads}
            left = sum(each.values())
            log.info("drain: outstanding %s", each)
        except Exception as exc:  # a server still starting up: ask again
            log.info("drain: %s", exc)
            left = -1
        if left == 0:
            return 0
        await asyncio.sleep(1.0)
    return left


WRITES = frozenset({("exchange", "store"), ("machines", "start"), ("machines", "call"), ("machines", "notify"),
                    ("interactions", "create"), ("interactions", "complete"), ("batching", "submit"),
                    ("batching", "complete")})
"""Client operations that write; the first one acknowledged after a failover ends its outage."""


def failover_times(ops: list[Op]) -> list[dict[str, Any]]:
    """For each ``pg_failover``: promotion, first acknowledged write sent after the kill, synchronous again."""
    writes = sorted((op for op in ops if (op.face, op.kind) in WRITES and op.outcome == OK), key=lambda op: op.end)
    found = []
    for fault in ops:
        if fault.face != "nemesis" or fault.kind != "pg_failover" or fault.outcome != OK:
            continue
        killed_at = float(fault.value["killed_at"])
        first = next((op.end for op in writes if op.start >= killed_at), None)
        found.append({
            "promoted_after_s": fault.value.get("promoted_after_s"),
            "first_write_after_s": round(first - killed_at, 2) if first is not None else None,
            "synchronous_after_s": fault.value.get("synchronous_after_s"),
        })
    return found


class WorkdirInUse(Exception):
    """The run's directory holds another run's files."""


async def run(profile: Profile, workdir: Path) -> Result:
    # A second run in the same directory would append to the first one's history and apply its messages to
    # the same ERP databases, where the checker reads the earlier run's effects as doubles.
    if workdir.exists() and any(workdir.iterdir()):  # noqa: ASYNC240 - once, before anything runs
        raise WorkdirInUse(f"{workdir} holds another run's files: give a new --workdir or remove it")
    workdir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before anything runs
    ha = HaPostgres() if profile.ha else None
    if ha is not None:
        log.info("bringing up the HA PostgreSQL (pg_auto_failover) on ports %d-%d", ha.base_port, ha.base_port + 2)
        await ha.up()
    cluster = Cluster(workdir, profile.servers, ha=ha)
    history = History(workdir / "history.jsonl")
    workloads: list[Workload] = []
    started = time.monotonic()
    try:
        await cluster.start()
        urls = [s.proxy.url for s in cluster.servers]
        direct = cluster.servers[0].process.url
        workloads = [kind(history, urls, direct, workdir, profile.rate) for kind in ALL]
        for workload in workloads:
            await workload.setup()
        producing, working, faulting = asyncio.Event(), asyncio.Event(), asyncio.Event()
        nemesis = Nemesis(cluster, history, profile.nemesis)
        producers = [asyncio.create_task(w.produce(producing)) for w in workloads]
        workers = [asyncio.create_task(w.work(working)) for w in workloads]
        faults = asyncio.create_task(nemesis.run(faulting))
        log.info("cluster up (%d servers), workloads and nemesis running for %.0f s", profile.servers, profile.duration_s)
        await asyncio.sleep(profile.duration_s)
        faulting.set()
        await faults
        await nemesis.settle()
        await cluster.heal()
        producing.set()
        await asyncio.gather(*producers, return_exceptions=True)
        # Reads go to a server that is surely up now.
        direct = cluster.servers[0].process.url
        for workload in workloads:
            workload.direct = direct
        log.info("faults over (%s); draining", dict(nemesis.counts))
        drain_started = time.monotonic()
        left = await _drain(workloads, profile.drain_s)
        drained_in = time.monotonic() - drain_started
        working.set()
        await asyncio.gather(*workers, return_exceptions=True)
        final = FinalState(drained=True)
        for workload in workloads:
            await workload.read_final(final)
        violations: list[Violation] = check(history.ops, final)
        result = Result(
            profile=profile.name,
            duration_s=round(profile.duration_s, 1),
            drain_s=round(drained_in, 1),
            wall_s=round(time.monotonic() - started, 1),
            faults=dict(nemesis.counts),
            skipped_faults=nemesis.skipped,
            operations=summarize([op for op in history.ops if op.face != "nemesis"]),
            restarts=summarize([op for op in history.ops if op.face == "nemesis" and op.kind == "restart"]).get("nemesis.restart", {}),
            operation_count=sum(1 for op in history.ops if op.face != "nemesis"),
            keys=verdicts([op for op in history.ops if op.face != "nemesis"]),
            violations=[str(v) for v in violations],
            outstanding_after_drain=left,
            workdir=str(workdir),
            failovers=failover_times(history.ops),
        )
        (workdir / "result.json").write_text(result.to_json())
        log.info("chaos run done in %.0f s", time.monotonic() - started)
        return result
    finally:
        for workload in workloads:
            with contextlib.suppress(Exception):
                await workload.close()
        history.close()
        try:
            await cluster.stop()
        finally:
            if ha is not None:
                await ha.down(keep_logs=workdir / "ha-postgres")


def describe(result: Result) -> str:
    """A human summary of a result."""
    lines: list[Any] = [
        f"profile {result.profile}: {result.duration_s:.0f} s of faults, drained in {result.drain_s:.0f} s, "
        f"{result.wall_s:.0f} s in all",
        "restarts: " + ", ".join(f"{k} {v}" for k, v in result.restarts.items()),
        "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(result.faults.items())),
        f"operations: {result.operation_count}",
    ]
    for kind, counts in result.operations.items():
        keys = result.keys.get(kind, {})
        lines.append(f"  {kind}: attempts " + ", ".join(f"{k} {v}" for k, v in counts.items())
                     + " | keys " + ", ".join(f"{k} {v}" for k, v in keys.items()))
    if result.failovers:
        lines.append(f"PostgreSQL failovers: {len(result.failovers)}")
        for what in ("promoted_after_s", "first_write_after_s", "synchronous_after_s"):
            values = sorted(float(f[what]) for f in result.failovers if f.get(what) is not None)
            if values:
                lines.append(f"  kill -> {what[:-8].replace('_', ' ')}: p50 {statistics.median(values):.1f} s, "
                             f"max {values[-1]:.1f} s ({len(values)} of {len(result.failovers)})")
    for kind, why in result.skipped_faults.items():
        lines.append(f"not injected: {kind}: {why}")
    lines.append(f"violations: {len(result.violations)}")
    lines.extend(f"  {v}" for v in result.violations[:50])
    lines.append(f"history and server logs: {result.workdir}")
    return "\n".join(str(line) for line in lines)
