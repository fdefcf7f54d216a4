"""The batching face as the server mounts it: routes, the dispatcher, retention, metrics and in-server workers."""

from mainspring.batching import metrics, service
from mainspring.batching.cli import cli
from mainspring.batching.dispatcher import dispatcher_loop
from mainspring.batching.routes import routes
from mainspring.batching.tables import batching_counts
from mainspring.batching.worker import recover, workers_loop
from mainspring.core.runtime import Context, run_loop
from mainspring.face import Face


async def retention_loop(ctx: Context) -> None:
    """Delete finished packages and their tasks past ``batching.retention_ms``, in small batches."""
    cfg = ctx.settings.batching
    if cfg.retention_ms is None:
        return

    async def step() -> int | None:
        pruned = await service.prune_finished(ctx.store, ctx.now_ms() - cfg.retention_ms, cfg.retention_batch)
        # A full batch means more are waiting: come back at once rather than after the interval.
        return ctx.now_ms() if pruned.filled(cfg.retention_batch) else None

    await run_loop(ctx, "batching-retention", step, channel="batching-retention", poll_ms=cfg.retention_interval_ms)


face = Face(
    name="batching", routes=routes, recover=recover, loops=[dispatcher_loop, retention_loop, workers_loop], cli=cli,
    read_gauges=metrics.read_gauges, kept_counts=[batching_counts],
)
