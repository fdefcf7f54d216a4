"""Business metrics: what an on-call engineer pages on, in Prometheus' text format at ``/metrics``.

Two kinds. Counters are counted as things happen (``…_total``), in the process that did them. Gauges of what
the store holds (items by status, processes IN_DOUBT, the outbox's lag) are read from the store when scraped,
at most once per ``REFRESH_S`` however often Prometheus asks, by each face's ``read_gauges``. Labels are
names (queues, namespaces, mailboxes, batchers, publishers), never ids, so their number stays bounded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import Gauge

from mainspring.core import data

if TYPE_CHECKING:
    from mainspring.core.runtime import Context

REFRESH_S = 2.0

OUTBOX_LAG = Gauge("mainspring_outbox_unnumbered_events",
                   "Committed events without a position: always 0 since events are numbered as they are written (kept for dashboards)")
PUBLISHER_LAG = Gauge("mainspring_publisher_lag_events", "Events a publisher has yet to publish, behind the outbox's head", ["publisher"])
OUTBOX_HEAD = Gauge("mainspring_outbox_head_position", "Position of the newest numbered event")

OPEN_ALERTS = Gauge("mainspring_alerts_open", "Alerts neither acknowledged nor closed (their subject not fixed yet), by code", ["code"])

GaugeReader = Callable[["Context"], Awaitable[None]]


def set_all(gauge: Gauge, values: Iterable[tuple[tuple[str, ...], float]]) -> None:
    """Replace every series of ``gauge``: a name that is gone does not linger at its last value."""
    gauge.clear()
    for labels, value in values:
        gauge.labels(*labels).set(value)


async def read_outbox_gauges(ctx: Context) -> None:
    from mainspring.core.publishers import sinks_from_settings

    names = [sink.name for sink in sinks_from_settings(ctx.settings.events)]
    async with ctx.store.read() as conn:
        head = await data.head_position(conn)
        cursors = {name: await data.cursor_position(conn, name) or 0 for name in names}
    OUTBOX_HEAD.set(head)
    OUTBOX_LAG.set(0)
    set_all(PUBLISHER_LAG, (((name,), max(0, head - position)) for name, position in cursors.items()))


async def read_alert_gauges(ctx: Context) -> None:
    async with ctx.store.read() as conn:
        counted = await data.count_open_alerts(conn)
    set_all(OPEN_ALERTS, (((code,), n) for code, n in counted.items()))


class Gauges:
    """Refreshes the gauges of every face from the store, at most once per ``REFRESH_S``."""

    def __init__(self, readers: Iterable[GaugeReader]) -> None:
        self._readers = list(readers)
        self._read_at = 0.0
        self._lock = asyncio.Lock()

    async def refresh(self, ctx: Context) -> None:
        async with self._lock:
            if time.monotonic() - self._read_at < REFRESH_S:
                return
            if ctx.store.dialect.parallel_reads:
                # Side by side, each on a connection of its own: a scrape waits for the slowest reader, not
                # for the sum of their round trips.
                await asyncio.gather(*(read(ctx) for read in self._readers))
            else:
                for read in self._readers:  # SQLite: one file, no gain from reading it side by side
                    await read(ctx)
            self._read_at = time.monotonic()
