"""``mainspring worker``: everything an App registers that can run outside the server — its queue handlers
and its batch workers — against the store, or (``--url``) through a server's HTTP API without any database
credentials, with an optional ``/healthz`` and ``/metrics`` port.

Machine processors are not run here: the server calls them (registered in-process with ``mainspring serve
--app``, or over HTTP). Workflows are (on the store): the worker takes the due runs of its app's workflows, and
advances them, as a server with ``--app`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from mainspring.app import App, AppError
from mainspring.batching import worker as batching_worker
from mainspring.client._async.batching import AsyncBatchingClient
from mainspring.client._async.interactions import AsyncInteractionsClient
from mainspring.client.errors import NotFound, ServiceUnavailable
from mainspring.config import Settings
from mainspring.core.runtime import Context, settle_heap
from mainspring.core.settings import ServerSettings
from mainspring.interactions.face import periodic_loop, sync_app_schedules
from mainspring.interactions.sources import LONG_POLL_MS, HttpQueues, QueueSource
from mainspring.interactions.worker import Worker as QueueWorker
from mainspring.machines.background import ONLY, machines_loop
from mainspring.store import Store
from mainspring.web import transport
from mainspring.workflows import service as workflows_service  # also: a task that finishes here wakes its run
from mainspring.workflows.runner import runner_of

if TYPE_CHECKING:
    import uvicorn  # imported when a health port is served: it costs start-up time

log = logging.getLogger("mainspring.worker")

IN_FLIGHT = Gauge("mainspring_worker_in_flight", "Items a worker's queue handlers are running", ["queue"])
BATCHER_SETTINGS = ("min_size", "max_size", "linger_ms", "max_wait_ms", "group_size", "incomplete_group")
HANDLED = Gauge("mainspring_worker_handled", "Items a worker's queue handlers have finished", ["queue"])


def runnable(app: App) -> str:
    """What a worker runs for ``app``, in one line; ``AppError`` when it registers nothing it can run."""
    parts = []
    if app.queues:
        parts.append("queues " + ", ".join(f"{n} (concurrency {r.options.get('concurrency', 10)})" for n, r in sorted(app.queues.items())))
    if app.batchers:
        parts.append("batchers " + ", ".join(f"{n} (concurrency {r.options.get('concurrency', 1)})" for n, r in sorted(app.batchers.items())))
    if app.workflows:
        parts.append("workflows " + ", ".join(sorted(app.workflows)))
    if app.schedules:
        parts.append("schedules " + ", ".join(f"{n} ({r.options['cron']} into {r.options['queue']})" for n, r in sorted(app.schedules.items())))
    processors = sorted(set(app.processors) - set(app.workflows))
    if not parts:
        only = f" (it registers only processors: {', '.join(processors)}; run them with `mainspring serve --app`)" if processors else ""
        raise AppError(f"the app has no queue handler or batch worker to run, nor a workflow{only}")
    if processors:
        # The server calls a machine's processor inside its own request or timer: a worker cannot take them.
        parts.append(f"processors {', '.join(processors)} run in the server (mainspring serve --app), not here")
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


def health_server(asgi: Starlette, host: str, port: int, settings: ServerSettings) -> uvicorn.Server:
    """A uvicorn server for ``asgi`` that leaves SIGTERM and SIGINT to the worker. (uvicorn ≥ 0.54 takes them
    over while ``serve()`` runs and raises them again when it returns; the loop's own handler, woken as well,
    then saw one SIGTERM twice and stopped by force.) Its protocol and limits are the main server's (head
    size, head and keep-alive timeouts): a health port is reachable by whatever probes it."""
    import uvicorn

    class HealthServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return HealthServer(transport.uvicorn_config(asgi, settings, host=host, port=port, access_log=False, lifespan="off"))


@dataclass
class Remote:
    """A worker that works through a server's HTTP API (``mainspring worker --url``) instead of the store."""

    url: str
    token: str | None = None
    long_poll_ms: int = LONG_POLL_MS


async def run(settings: Settings, app: App, *, http_host: str = "127.0.0.1", http_port: int | None = None,
              stop: asyncio.Event | None = None, started: asyncio.Event | None = None, remote: Remote | None = None,
              own_process: bool = False) -> None:
    """Run ``app``'s queues and batchers until ``stop`` is set, or SIGTERM/SIGINT (graceful: running
    handlers get ``server.graceful_shutdown_ms``; a second signal stops at once). On the store of
    ``settings``, or with ``remote`` through that server's HTTP API (no database needed). ``own_process``:
    the process is the worker's alone (``mainspring worker``), and its start-up heap is settled
    (``settle_heap``) before the first item."""
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
    async with contextlib.AsyncExitStack() as resources:
        stopping = asyncio.Event()
        queue_source: Store | QueueSource
        package_source: batching_worker.PackageSource
        if remote is None:
            # Generic plans only: a worker sends a few statements thousands of times, each written to keep its
            # index without its parameters (tests/interactions/test_generic_plans.py). Left to choose, PostgreSQL
            # re-plans the lease at every call on a big store (~0.5 ms each: its generic plan, costed for an
            # average queue, looks costlier than a custom one for a small queue) — bench/history/2026-11-27-scale4.md.
            store = Store(server.database_url(), pool_size=server.pool_size, sqlite_synchronous=server.sqlite_synchronous,
                          generic_plans=True)
            await store.start()
            resources.push_async_callback(store.close)
            ctx = Context(settings=settings, store=store, registry=app, stopping=stopping)
            await batching_worker.recover(ctx)
            queue_source, package_source = store, batching_worker.StoreCafe(ctx)
            if app.schedules:
                # @app.periodic as under `serve --app`: stored, and fired by this worker too; each tick is created
                # once across every worker and server (the tick is its idempotency key).
                await sync_app_schedules(ctx)
                resources.push_async_callback(_stop_tasks, [asyncio.create_task(periodic_loop(ctx), name="interactions:periodic")], stopping)
            if app.workflows:
                # The due runs of this app's workflows only (a namespace's machines are the workflow's runs).
                ctx.extras[ONLY] = sorted(app.workflows)
                await workflows_service.store_namespaces(ctx)
                resources.push_async_callback(_stop_tasks, [
                    asyncio.create_task(machines_loop(ctx), name="workflows:due"),
                    asyncio.create_task(runner_of(ctx).loop(), name="workflows:runner"),
                ], stopping)
        else:
            if app.workflows:
                raise AppError(f"workflows ({', '.join(sorted(app.workflows))}) run on the store, not through --url: "
                               "run this worker with the database, or the server with --app")
            items = await resources.enter_async_context(AsyncInteractionsClient(remote.url, remote.token))
            packages = await resources.enter_async_context(AsyncBatchingClient(remote.url, remote.token))
            await wait_for_server(items, packages, app, server.startup_wait_ms)
            for name, registration in sorted(app.schedules.items()):
                # Through the API the server stores the schedule and its periodic loop fires the ticks.
                options = registration.options
                await items.put_periodic(name, cron=options["cron"], queue=options["queue"], data=options["data"],
                                         timezone=options["timezone"], catch_up_ms=options["catch_up_ms"])
            queue_source = HttpQueues(items, long_poll_ms=remote.long_poll_ms)
            package_source = batching_worker.HttpCafe(packages, long_poll_ms=remote.long_poll_ms)
        queues = QueueWorker(queue_source, app, settings.interactions, poll_ms=server.poll_interval_ms)
        if own_process:
            settle_heap()
        await work(queues, package_source, app, stopping, stop, force, started, settings,
                   f"; /healthz and /metrics on http://{http_host}:{http_port}" if http_port is not None else "",
                   None if http_port is None else health_server(health_app(queues, app, stop), http_host, http_port, server), what)


async def _stop_tasks(tasks: list[asyncio.Task[None]], stopping: asyncio.Event) -> None:
    stopping.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def wait_for_server(items: AsyncInteractionsClient, packages: AsyncBatchingClient, app: App, within_ms: int) -> None:
    """Read each queue's and batcher's settings once (creating a batcher that does not exist yet), so a wrong
    URL or token stops the worker at once; an unreachable server is waited for up to ``within_ms``."""
    retrying = AsyncRetrying(
        retry=retry_if_exception_type(ServiceUnavailable),
        stop=stop_after_delay(within_ms / 1000),
        wait=wait_exponential_jitter(initial=0.1, max=2.0),
        before_sleep=lambda state: log.warning("waiting for the server: %s", state.outcome.exception() if state.outcome else "?"),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            for queue in app.queues:
                await items.get_queue(queue)
            for batcher, registration in app.batchers.items():
                try:
                    await packages.get_batcher(batcher)
                except NotFound:
                    # A new batcher is created with @app.batcher's settings, as a worker with the store does.
                    given = {k: registration.options[k] for k in BATCHER_SETTINGS if registration.options.get(k) is not None}
                    await packages.put_batcher(batcher, **given)


async def work(queues: QueueWorker, package_source: batching_worker.PackageSource, app: App, stopping: asyncio.Event,
               stop: asyncio.Event, force: asyncio.Event, started: asyncio.Event | None, settings: Settings, where: str,
               http: Any, what: str) -> None:
    """Run until ``stop``, then stop gracefully (or by force when ``force`` is set meanwhile)."""
    graceful_ms = settings.server.graceful_shutdown_ms
    batchers: asyncio.Task[None] | None = None
    http_task: asyncio.Task[None] | None = None
    try:
        await queues.start()
        if app.batchers:
            batchers = asyncio.create_task(batching_worker.run_workers(package_source, app.batchers, stopping), name="batchers")
        if http is not None:
            http_task = asyncio.create_task(http.serve(), name="worker-http")
        log.info("worker %s runs %s%s", queues.id, what, where)
        if started is not None:
            started.set()
        await stop.wait()
        log.info("worker %s stopping (running handlers get %d ms; signal again to stop at once)", queues.id, graceful_ms)
        stopping.set()
        graceful: asyncio.Future[Any] = asyncio.gather(
            queues.stop(True, graceful_ms),
            *([asyncio.wait_for(asyncio.shield(batchers), graceful_ms / 1000)] if batchers else []),
            return_exceptions=True)
        forced: asyncio.Future[Any] = asyncio.ensure_future(force.wait())
        await asyncio.wait({graceful, forced}, return_when=asyncio.FIRST_COMPLETED)
        if not graceful.done():
            log.warning("worker %s stopping by force: running handlers are cancelled, their leases expire", queues.id)
            await queues.stop(False)
        forced.cancel()
        await asyncio.gather(graceful, return_exceptions=True)
    finally:
        stopping.set()
        if batchers is not None:
            batchers.cancel()
            await asyncio.gather(batchers, return_exceptions=True)
        if http is not None and http_task is not None:
            http.should_exit = True
            await asyncio.gather(http_task, return_exceptions=True)
