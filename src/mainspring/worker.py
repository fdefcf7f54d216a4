"""``mainspring worker``: everything an App registers that can run outside the server — its queue handlers
and its batch workers — against the store, with an optional ``/healthz`` and ``/metrics`` port.

Machine processors are not run here: the server calls them (registered in-process with ``mainspring serve
--app``, or over HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mainspring.app import App, AppError
from mainspring.batching import worker as batching_worker
from mainspring.config import Settings
from mainspring.core.runtime import Context
from mainspring.interactions.worker import Worker as QueueWorker
from mainspring.store import Store

log = logging.getLogger("mainspring.worker")

IN_FLIGHT = Gauge("mainspring_worker_in_flight", "Items a worker's queue handlers are running", ["queue"])
HANDLED = Gauge("mainspring_worker_handled", "Items a worker's queue handlers have finished", ["queue"])


def runnable(app: App) -> str:
    """What a worker runs for ``app``, in one line; ``AppError`` when it registers nothing it can run."""
    parts = []
    if app.queues:
        parts.append("queues " + ", ".join(f"{n} (concurrency {r.options.get('concurrency', 10)})" for n, r in sorted(app.queues.items())))
    if app.batchers:
        parts.append("batchers " + ", ".join(f"{n} (concurrency {r.options.get('concurrency', 1)})" for n, r in sorted(app.batchers.items())))
    if not parts:
        only = f" (it registers only processors: {', '.join(sorted(app.processors))}; run them with `mainspring serve --app`)" if app.processors else ""
        raise AppError(f"the app has no queue handler or batch worker to run{only}")
    if app.processors:
        # The server calls a machine's processor inside its own request or timer: a worker cannot take them.
        parts.append(f"processors {', '.join(sorted(app.processors))} run in the server (mainspring serve --app), not here")
    return "; ".join(parts)


def health_app(worker: QueueWorker, app: App, stopping: asyncio.Event) -> Starlette:
    """``/healthz`` (what runs, 503 while stopping) and ``/metrics`` (Prometheus text) of a worker."""

    async def healthz(_request: Request) -> JSONResponse:
        body: dict[str, Any] = {
            "status": "stopping" if stopping.is_set() else "ok",
            "worker": worker.id,
            "queues": {name: {"in_flight": len(r.inflight), "handled": r.handled} for name, r in worker.runners.items()},
            "batchers": sorted(app.batchers),
        }
        return JSONResponse(body, status_code=503 if stopping.is_set() else 200)

    async def metrics(_request: Request) -> Response:
        for name, runner in worker.runners.items():
            IN_FLIGHT.labels(name).set(len(runner.inflight))
            HANDLED.labels(name).set(runner.handled)
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/healthz", healthz), Route("/metrics", metrics)])


def health_server(asgi: Starlette, host: str, port: int) -> Any:
    """A uvicorn server for ``asgi`` that leaves SIGTERM and SIGINT to the worker. (uvicorn ≥ 0.54 takes them
    over while ``serve()`` runs and raises them again when it returns; the loop's own handler, woken as well,
    then saw one SIGTERM twice and stopped by force.)"""
    import uvicorn

    class HealthServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return HealthServer(uvicorn.Config(asgi, host=host, port=port, log_config=None, access_log=False, lifespan="off"))


async def run(settings: Settings, app: App, *, http_host: str = "127.0.0.1", http_port: int | None = None,
              stop: asyncio.Event | None = None, started: asyncio.Event | None = None) -> None:
    """Run ``app``'s queues and batchers until ``stop`` is set, or SIGTERM/SIGINT (graceful: running
    handlers get ``server.graceful_shutdown_ms``; a second signal stops at once)."""
    what = runnable(app)
    stop = stop or asyncio.Event()
    force = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        (force if stop.is_set() else stop).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)
    server = settings.server
    store = Store(server.database_url(), pool_size=server.pool_size, sqlite_synchronous=server.sqlite_synchronous)
    await store.start()
    ctx = Context(settings=settings, store=store, registry=app)
    queues = QueueWorker(store, app, settings.interactions, poll_ms=server.poll_interval_ms)
    batchers: asyncio.Task[None] | None = None
    http: Any = None
    http_task: asyncio.Task[None] | None = None
    try:
        await batching_worker.recover(ctx)
        await queues.start()
        if app.batchers:
            batchers = asyncio.create_task(batching_worker.workers_loop(ctx), name="batchers")
        if http_port is not None:
            http = health_server(health_app(queues, app, stop), http_host, http_port)
            http_task = asyncio.create_task(http.serve(), name="worker-http")
        log.info("worker %s runs %s%s", queues.id, what,
                 f"; /healthz and /metrics on http://{http_host}:{http_port}" if http_port is not None else "")
        if started is not None:
            started.set()
        await stop.wait()
        log.info("worker %s stopping (running handlers get %d ms; signal again to stop at once)",
                 queues.id, server.graceful_shutdown_ms)
        ctx.stopping.set()
        graceful: asyncio.Future[Any] = asyncio.gather(
            queues.stop(True, server.graceful_shutdown_ms),
            *([asyncio.wait_for(asyncio.shield(batchers), server.graceful_shutdown_ms / 1000)] if batchers else []),
            return_exceptions=True)
        forced: asyncio.Future[Any] = asyncio.ensure_future(force.wait())
        await asyncio.wait({graceful, forced}, return_when=asyncio.FIRST_COMPLETED)
        if not graceful.done():
            log.warning("worker %s stopping by force: running handlers are cancelled, their leases expire", queues.id)
            await queues.stop(False)
        forced.cancel()
        await asyncio.gather(graceful, return_exceptions=True)
    finally:
        ctx.stopping.set()
        if batchers is not None:
            batchers.cancel()
            await asyncio.gather(batchers, return_exceptions=True)
        if http is not None and http_task is not None:
            http.should_exit = True
            await asyncio.gather(http_task, return_exceptions=True)
        await store.close()
