"""CPU used by this machine's PostgreSQL, for the benches that report CPU per item beside their rates."""

from __future__ import annotations

import os
from pathlib import Path


def postgres_cpu_s() -> float:
    """CPU seconds used so far by the PostgreSQL processes alive now (this machine's server; only meaningful
    when nothing else uses it)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
            if fields[0].endswith("(postgres"):
                parts = fields[1].split()
                total += int(parts[11]) + int(parts[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def backends_cpu_s(pids: set[int]) -> float:
    """CPU seconds used so far by the PostgreSQL backends ``pids`` that are still alive: one database's share,
    even while other databases of the same server are busy (its connections must outlive the measurement)."""
    total = 0
    for pid in pids:
        try:
            parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(parts[11]) + int(parts[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


async def database_backends(dsn: str) -> set[int]:
    """The PostgreSQL backends serving ``dsn``'s database now (asked from its server's ``postgres`` database)."""
    import asyncpg

    base, database = dsn.rsplit("/", 1)
    conn = await asyncpg.connect(base + "/postgres")
    try:
        rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", database.split("?")[0])
    finally:
        await conn.close()
    return {row["pid"] for row in rows}


class DatabaseCpu:
    """CPU seconds of one database's backends between ``start`` and ``stop``, while other databases of the
    same server are busy (the machine is shared): the backends alive at either end (a pool's connections
    outlive the measurement)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.pids: set[int] = set()
        self.began = 0.0

    async def start(self) -> None:
        self.pids = await database_backends(self.dsn)
        self.began = backends_cpu_s(self.pids)

    async def stop(self) -> float:
        self.pids |= await database_backends(self.dsn)
        return backends_cpu_s(self.pids) - self.began
