"""The machines face as the server mounts it."""

from __future__ import annotations

import logging
from typing import Protocol

from mainspring.core.runtime import Context
from mainspring.face import Face
from mainspring.machines import metrics
from mainspring.machines.background import machines_loop
from mainspring.machines.cli import cli
from mainspring.machines.namespaces import close_processors, save_namespace
from mainspring.machines.routes import routes
from mainspring.machines.service import fixed_alerts
from mainspring.machines.settings import MachinesSettings
from mainspring.machines.tables import machine_counts
from mainspring.web.routing import Routes

log = logging.getLogger("mainspring.machines")


class WithMachines(Protocol):
    """The server's settings, as far as this face reads them (they are defined above the faces)."""

    @property
    def machines(self) -> MachinesSettings: ...


def machinegun_routes(settings: WithMachines) -> list[Routes]:
    """The Machinegun Automaton operation, when the ``machinegun`` extra (thriftpy2) is installed."""
    try:
        from mainspring.machines.machinegun.automaton import automaton_routes
    except ImportError:  # the bare install: the JSON API only
        log.info("thriftpy2 is not installed: Machinegun's Thrift Automaton is not served (pip install 'mainspring[machinegun]')")
        return []
    return automaton_routes(settings)


async def recover(ctx: Context) -> None:
    """Write the config file's namespaces. Unfinished work needs nothing special: due timers, pending
    notifications and steps of a dead server (their leases run out) are taken by the loop like any other."""
    configured = ctx.settings.machines.namespaces
    if configured:
        async with ctx.store.transaction() as tx:
            for name, config in configured.items():
                await save_namespace(tx, name, config)


async def run_machinegun_sinks(ctx: Context) -> None:
    """Machinegun-format Kafka sinks, when configured (they need the ``machinegun`` extra)."""
    if not ctx.settings.machines.machinegun.sinks:
        return
    from mainspring.machines.machinegun.sink import run_machinegun_sinks as run

    await run(ctx)


async def run_machinegun_listener(ctx: Context) -> None:
    """Machinegun's own listener (``machines.machinegun.listen``), when configured."""
    if ctx.settings.machines.machinegun.listen is None:
        return
    from mainspring.machines.machinegun.listener import run_listener

    await run_listener(ctx)


def machinegun_publishers(settings: WithMachines) -> list[str]:
    """The cursor names of the Machinegun-format sinks (``ThriftKafkaSink.name``), kept by retention."""
    return [f"machinegun-kafka:{sink.topic}" for sink in settings.machines.machinegun.sinks]


async def run_machines(ctx: Context) -> None:
    try:
        await machines_loop(ctx)
    finally:
        await close_processors(ctx)


face = Face(
    name="machines", routes=routes, recover=recover, loops=[run_machines, run_machinegun_sinks, run_machinegun_listener], cli=cli,
    read_gauges=metrics.read_gauges, fixed_alerts={"machine_failed": fixed_alerts},
    routes_for=machinegun_routes, publishers_for=machinegun_publishers, kept_counts=[machine_counts],
)
