"""Prometheus metrics of the machines face (see ``core.metrics``). Labels are namespace names (and the
step kind or error code, a handful of values each), never machine ids."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from mainspring.core.metrics import set_all
from mainspring.machines import data

if TYPE_CHECKING:
    from mainspring.core.runtime import Context
    from mainspring.store import Transaction

MACHINES = Gauge("mainspring_machines", "Machines by namespace and status (working, failed)", ["namespace", "status"])
DUE_TIMERS = Gauge("mainspring_machines_due_timers", "Working machines whose timer is due but has not fired yet", ["namespace"])
OLDEST_DUE_TIMER = Gauge(
    "mainspring_machines_oldest_due_timer_seconds", "How long the most overdue timer of a namespace has been due", ["namespace"]
)
STEPS = Counter(
    "mainspring_machines_steps_total", "Processor answers applied, by kind (init, call, timeout, notification, repair)", ["namespace", "kind"]
)
PROCESSOR_ERRORS = Counter(
    "mainspring_machines_processor_errors_total",
    "Processor calls that gave no answer or refused, by kind and code (processor_failed, processor_timeout, processor_refused)",
    ["namespace", "kind", "code"],
)
TIMER_LATENESS = Histogram(
    "mainspring_machines_timer_lateness_seconds", "From a timer's due time to the processor call that fires it", ["namespace"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)


async def read_gauges(ctx: Context) -> None:
    now = ctx.store.now_ms()
    async with ctx.store.read() as conn:
        counted = await data.count_by_namespace_and_status(conn)
        due = await data.due_timers_by_namespace(conn, now)
    set_all(MACHINES, (((ns, status), n) for ns, status, n in counted))
    set_all(DUE_TIMERS, (((ns,), n) for ns, n, _ in due))
    set_all(OLDEST_DUE_TIMER, (((ns,), max(0.0, (now - oldest) / 1000)) for ns, _, oldest in due))


# The labelled children, found once per label values: ``labels()`` validates and locks on every call, and a
# step counts itself on every step.
_steps = functools.lru_cache(maxsize=4096)(STEPS.labels)
_lateness = functools.lru_cache(maxsize=4096)(TIMER_LATENESS.labels)


def step_applied(namespace: str, kind: str) -> None:
    """Count a processor answer applied (after its commit)."""
    _steps(namespace, kind).inc()


def timer_fired(namespace: str, late_ms: int) -> None:
    """Record how late a timer fired."""
    _lateness(namespace).observe(max(0, late_ms) / 1000)


def count_step(tx: Transaction, namespace: str, kind: str) -> None:
    """Count an applied step once its transaction commits (a rolled-back step did not happen)."""
    tx.after_commit(lambda: step_applied(namespace, kind))


def count_processor_error(namespace: str, kind: str, code: str) -> None:
    PROCESSOR_ERRORS.labels(namespace, kind, code).inc()
