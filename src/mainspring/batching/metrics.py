"""Prometheus metrics of the batching face (see ``core.metrics``). Labels are batcher names, never ids."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from mainspring.batching import data
from mainspring.core.metrics import set_all

if TYPE_CHECKING:
    from mainspring.core.runtime import Context

TASKS = Gauge("mainspring_batching_tasks", "Tasks still in the dispatcher or the cafe, by batcher and status (pending, packed, claimed)",
              ["batcher", "status"])
FORMING = Gauge("mainspring_batching_forming_tasks", "Pending tasks in a batch whose linger timer runs", ["batcher"])
PACKAGES = Gauge("mainspring_batching_packages", "Packages by batcher and status (finished ones until retention)", ["batcher", "status"])
CLAIMS = Counter("mainspring_batching_package_claims_total", "Packages claimed by a worker (a retake after expiry too)", ["batcher"])
LEASE_EXPIRIES = Counter("mainspring_batching_lease_expiries_total", "Package leases that expired and put the package back", ["batcher"])


async def read_gauges(ctx: Context) -> None:
    async with ctx.store.read() as conn:
        tasks = await data.count_live_tasks(conn)
        forming = await data.count_forming_tasks(conn)
        packages = await data.count_packages(conn)
    set_all(TASKS, (((batcher, status), n) for batcher, status, n in tasks))
    set_all(FORMING, (((batcher,), n) for batcher, n in forming))
    set_all(PACKAGES, (((batcher, status), n) for batcher, status, n in packages))
