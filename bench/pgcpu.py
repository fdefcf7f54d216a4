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
