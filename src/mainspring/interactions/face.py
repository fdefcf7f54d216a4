"""The interactions face as the server mounts it: routes, lease expiry, retention, and the worker runtime."""

from __future__ import annotations

import asyncio

from mainspring.core.runtime import Context, run_loop
from mainspring.face import Face
from mainspring.interactions import leasing, metrics, periodic, service
from mainspring.interactions.cli import cli
from mainspring.interactions.routes import routes


async def expire_leases_loop(ctx: Context) -> None:
    """Turn expired leases into retries in queues nobody is leasing from (leasing does it too)."""
    cfg = ctx.settings.interactions

    async def step() -> int | None:
        return await leasing.expire_all(ctx.store, cfg)

    await run_loop(ctx, "interactions-expiry", step, channel="interactions-expiry", poll_ms=cfg.expiry_interval_ms)


async def retention_loop(ctx: Context) -> None:
    """Delete finished interactions past their queue's retention, and owner rows that keep nothing, in small batches."""
    cfg = ctx.settings.interactions

    async def step() -> int | None:
        deleted = await service.prune_finished(ctx.store, cfg.retention_batch)
        await service.prune_idle_owners(ctx.store, cfg.retention_batch)
        # A full batch means more are waiting: come back at once rather than after the interval.
        return ctx.now_ms() if deleted >= cfg.retention_batch else None

    await run_loop(ctx, "interactions-retention", step, channel="interactions-retention", poll_ms=cfg.retention_interval_ms)


async def sync_app_schedules(ctx: Context) -> None:
    """Store the schedules the app registers with ``@app.periodic`` (start-up; the same on every server)."""
    for name, registration in getattr(ctx.registry, "schedules", {}).items():
        options = registration.options
        await periodic.put_schedule(
            ctx.store, name, cron=options["cron"], queue=options["queue"], data_=options.get("data"),
            timezone=options.get("timezone", "UTC"), catch_up_ms=options.get("catch_up_ms", periodic.DEFAULT_CATCH_UP_MS), source="app",
        )


async def periodic_loop(ctx: Context) -> None:
    """Create the interactions of due schedule ticks, on whichever server finds them first."""
    cfg = ctx.settings.interactions

    async def step() -> int | None:
        return await periodic.fire_due_schedules(ctx.store, cfg)

    await run_loop(ctx, "interactions-periodic", step, channel=periodic.PERIODIC_CHANNEL)


async def workers_loop(ctx: Context) -> None:
    """Run the handlers registered with ``@app.queue`` inside the server."""
    from mainspring.interactions.worker import Worker

    registry = ctx.registry
    if registry is None or not getattr(registry, "queues", None):
        return
    worker = Worker(ctx.store, registry, ctx.settings.interactions, poll_ms=ctx.settings.server.poll_interval_ms)
    ctx.extras["interactions.worker"] = worker
    await worker.start()
    await ctx.stopping.wait()
    # The server gives every loop graceful_shutdown_ms in all; finish within it, then stop by force.
    try:
        await worker.stop(graceful=True, timeout_ms=int(ctx.settings.server.graceful_shutdown_ms * 0.8))
    except asyncio.CancelledError:
        await worker.stop(graceful=False)
        raise


face = Face(
    name="interactions", routes=routes, recover=sync_app_schedules, loops=[expire_leases_loop, retention_loop, periodic_loop, workers_loop],
    cli=cli, read_gauges=metrics.read_gauges,
)
