"""Prometheus metrics of the interactions face (see ``core.metrics``)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge

from mainspring.core.metrics import set_all
from mainspring.interactions import data

ITEMS = Gauge("mainspring_interactions", "Interactions by queue and status", ["queue", "status"])
ESTIMATED = Gauge(
    "mainspring_interactions_estimated", "1 where mainspring_interactions of that queue and status is an estimate (absent: exact)", ["queue", "status"]
)
OLDEST_READY = Gauge("mainspring_interactions_oldest_ready_seconds", "How long the oldest ready item of a queue has waited", ["queue"])
PROCESSED = Counter(
    "mainspring_interactions_processed_total", "Leases ended, by outcome (completed, failed, retried, repeated, waited)", ["queue", "outcome"]
)
OWNER_ITEMS = Gauge(
    "mainspring_interactions_owner", "Ready and processing interactions of a queue's busiest owners (queues with owner_by, top 20 each)",
    ["queue", "owner", "status"],
)
TOP_OWNERS = 20
LEASE_EXPIRIES = Counter("mainspring_interactions_lease_expiries_total", "Leases that expired unreleased", ["queue"])
RETRIED = Counter("mainspring_interactions_retried_total", "Failed or cancelled items run again on request", ["queue"])


async def read_gauges(ctx: Any) -> None:
    now = ctx.store.now_ms()
    async with ctx.store.read() as conn:
        counted = await data.count_by_status(conn, ctx.store, now)
        oldest = await data.oldest_ready(conn, now)
        owners = {q: await data.owner_counts(conn, now, q, TOP_OWNERS) for q in await data.owned_queues(conn)}
    set_all(ITEMS, (((queue, status), n) for queue, by_status in counted.by_queue.items() for status, n in by_status.items()))
    set_all(ESTIMATED, (((queue, status), 1) for queue, status in counted.estimated))
    set_all(OWNER_ITEMS, (
        ((queue, owner, status), n)
        for queue, top in owners.items() for owner, ready, processing in top for status, n in (("ready", ready), ("processing", processing))
    ))
    set_all(OLDEST_READY, (((queue,), max(0.0, (now - since) / 1000)) for queue, since in oldest.items()))


def outcome_name(outcome: Any) -> str:
    return {"Complete": "completed", "Fail": "failed", "Retry": "retried", "Repeat": "repeated", "Wait": "waited"}[type(outcome).__name__]
