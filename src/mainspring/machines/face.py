"""The machines face as the server mounts it."""

from __future__ import annotations

from mainspring.core.runtime import Context, Face
from mainspring.machines import metrics
from mainspring.machines.background import machines_loop
from mainspring.machines.cli import cli
from mainspring.machines.namespaces import HTTP_CLIENT, save_namespace
from mainspring.machines.routes import router
from mainspring.machines.service import fixed_alerts


async def recover(ctx: Context) -> None:
    """Write the config file's namespaces. Unfinished work needs nothing special: due timers, pending
    notifications and steps of a dead server (their leases run out) are taken by the loop like any other."""
    configured = ctx.settings.machines.namespaces
    if configured:
        async with ctx.store.transaction() as tx:
            for name, config in configured.items():
                await save_namespace(tx, name, config)


async def run_machines(ctx: Context) -> None:
    try:
        await machines_loop(ctx)
    finally:
        client = ctx.extras.pop(HTTP_CLIENT, None)
        if client is not None:
            await client.aclose()


face = Face(
    name="machines", router=router, recover=recover, loops=[run_machines], cli=cli, read_gauges=metrics.read_gauges,
    fixed_alerts={"machine_failed": fixed_alerts},
)
