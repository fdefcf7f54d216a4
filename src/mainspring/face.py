"""What a face hands the server: its operations, recovery, background loops, command line and metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mainspring.core.alerts import FixedAlerts
from mainspring.core.runtime import Context
from mainspring.store.counts import CountsTable
from mainspring.web.routing import Routes

if TYPE_CHECKING:
    import typer


@dataclass
class Face:
    """One face of Mainspring as the server mounts it."""

    name: str
    routes: Routes
    """The face's HTTP operations (its ``routes.py``)."""
    recover: Callable[[Context], Awaitable[None]] | None = None
    """Start-up recovery; the same code as normal running, run once before the loops start."""
    loops: Sequence[Callable[[Context], Awaitable[None]]] = ()
    """Background loops; each returns when ``ctx.stopping`` is set."""
    cli: typer.Typer | None = None
    """An optional typer app mounted as ``mainspring <name>``."""
    read_gauges: Callable[[Context], Awaitable[None]] | None = None
    """Sets the face's Prometheus gauges from the store (called when ``/metrics`` is scraped, rate-limited)."""
    fixed_alerts: Mapping[str, FixedAlerts] = field(default_factory=dict)
    """Per alert code the face raises, the check that tells which open ones are fixed (``core.alerts``)."""
    routes_for: Callable[[Any], Sequence[Routes]] | None = None
    """Operations whose paths come from the settings (given the server's ``Settings``), served beside ``routes``."""
    publishers_for: Callable[[Any], Sequence[str]] | None = None
    """Names of the face's own outbox publishers (given ``Settings``): retention keeps what they have not read."""
    kept_counts: Sequence[CountsTable] = ()
    """The face's counts tables kept by triggers (``store.counts``), whose gone backends' rows the server folds."""


__all__ = ["Face"]
