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
