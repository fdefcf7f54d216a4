"""The ASGI app: each face's routes, auth, errors, health, metrics, and the background loops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mainspring import __version__
from mainspring.app import App
from mainspring.batching.face import face as batching_face
from mainspring.config import Settings
from mainspring.core import alerts, outbox, tracing
from mainspring.core.auth import Authenticator, authenticate
from mainspring.core.docs_page import docs_routes, root_routes
from mainspring.core.errors import Unavailable
from mainspring.core.http import (
    COMMON_PROBLEMS,
    BodyLimitMiddleware,
    MetricsMiddleware,
    RateLimitMiddleware,
    RequestIdMiddleware,
    install_error_handlers,
    problem_response,
    problems_in_openapi,
)
from mainspring.core.logs import configure_logging
from mainspring.core.metrics import Gauges, read_alert_gauges, read_outbox_gauges
from mainspring.core.publishers import prune_published_events, run_publishers
from mainspring.core.routes import router as core_router
from mainspring.core.runtime import Context, Face, log_failure, retry_while_unavailable, run_loop
from mainspring.exchange.face import face as exchange_face
from mainspring.interactions.face import face as interactions_face
from mainspring.machines.face import face as machines_face
from mainspring.store import Clock, Store
from mainspring.store.replication import why_not_synchronous
from mainspring.ui.routes import router as ui_router

log = logging.getLogger("mainspring.server")

SEQUENCER_PAUSE_S = 0.002

FACES: list[Face] = [exchange_face, machines_face, interactions_face, batching_face]


async def close_fixed_alerts(ctx: Context) -> None:
    """Close the open alerts whose subject a face finds fixed (a background loop, on every server)."""
    checks = {code: check for face in FACES for code, check in face.fixed_alerts.items()}

    async def step() -> int | None:
        await alerts.close_fixed_alerts(ctx.store, checks)
        return None

    await run_loop(ctx, "alerts-closer", step, channel="alerts-closer", poll_ms=ctx.settings.server.alerts_check_interval_ms)


async def sequence_events(ctx: Context) -> None:
    sequencer = outbox.Sequencer(ctx.store)

    async def step() -> int | None:
        # Woken at each commit: a moment's pause lets one round number the events of many commits.
        await asyncio.sleep(SEQUENCER_PAUSE_S)
        while await sequencer.round() >= outbox.SEQUENCER_BATCH:
            pass
        return None

    if ctx.store.is_postgres:
        try:
            await run_loop(ctx, "events-sequencer", step, channel=outbox.SEQUENCER_CHANNEL, poll_ms=200)
        finally:
            await sequencer.close()


SERVE_SETTINGS_ENV = "MAINSPRING_SERVE_SETTINGS"
SERVE_APP_ENV = "MAINSPRING_SERVE_APP"


def serve_app() -> FastAPI:
    """The server of one ``mainspring serve --workers N`` process, from the settings the command resolved."""
    import os

    from mainspring.app import load_app

    settings = Settings.model_validate_json(os.environ[SERVE_SETTINGS_ENV])
    configure_logging(settings.server.log_level, settings.server.log_format, access_log=settings.server.access_log)
    spec = os.environ.get(SERVE_APP_ENV)
    return create_app(settings, registry=load_app(spec) if spec else None)


async def warn_unless_sync_replica(store: Store) -> None:
    """``server.require_sync_replica``: say so at start when an acknowledged write may live on one machine."""
    reason = await why_not_synchronous(store)
    if reason is not None:
        log.warning("server.require_sync_replica is set, but %s: an acknowledged write would not survive "
                    "the loss of the primary's machine", reason)


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    clock: Clock | None = None,
    registry: App | None = None,
    run_background: bool = True,
) -> FastAPI:
    """Build the server. Pass ``store`` (and a ``ManualClock``) in tests; ``run_background=False`` leaves
    the loops to the test."""
    store = store or Store(
        settings.server.database_url(),
        clock=clock,
        pool_size=settings.server.pool_size,
        sqlite_synchronous=settings.server.sqlite_synchronous,
    )
    ctx = Context(settings=settings, store=store, registry=registry or App())
    if settings.server.tracing and tracing.enable():
        tracing.instrument_engine(getattr(store.backend.engine, "sync_engine", store.backend.engine))

    async def start_up() -> None:
        """Everything before serving; re-run whole if the store goes away meanwhile (recovery is idempotent)."""
        await store.start()
        authenticator: Authenticator = app.state.authenticator
        if await authenticator.is_open():
            log.warning("no API tokens are configured: the server is OPEN to anyone who can reach it")
        if settings.server.require_sync_replica:
            await warn_unless_sync_replica(store)
        for face in FACES:
            if face.recover is not None:
                await face.recover(ctx)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await retry_while_unavailable("start-up", start_up, settings.server.startup_wait_ms)
        tasks: list[asyncio.Task[None]] = []
        if run_background:
            tasks.append(asyncio.create_task(sequence_events(ctx), name="events-sequencer"))
            tasks.append(asyncio.create_task(run_publishers(ctx), name="events-publishers"))
            own = [name for face in FACES if face.publishers_for is not None for name in face.publishers_for(settings)]
            tasks.append(asyncio.create_task(prune_published_events(ctx, own), name="events-retention"))
            tasks.append(asyncio.create_task(close_fixed_alerts(ctx), name="alerts-closer"))
            for face in FACES:
                for loop in face.loops:
                    tasks.append(asyncio.create_task(loop(ctx), name=f"{face.name}:{loop.__name__}"))
        log.info("mainspring %s ready on %s", __version__, store.dialect.name)
        try:
            yield
        finally:
            ctx.stopping.set()
            store.notifier.signal_all()
            if tasks:
                _done, pending = await asyncio.wait(tasks, timeout=settings.server.graceful_shutdown_ms / 1000)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await store.close()

    app = FastAPI(
        title="Mainspring",
        version=__version__,
        description="Durable processing: exchange, machines, interactions and batching on one store.",
        lifespan=lifespan,
        # /docs is served below from the package's own Swagger UI files; ReDoc would load from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.context = ctx
    app.state.authenticator = Authenticator(store, settings.auth.tokens, settings.auth.cache_ms)
    install_error_handlers(app)
    app.add_middleware(
        BodyLimitMiddleware,
        default=settings.server.max_json_bytes,
        limits=[("POST", r"/v1/exchange/mailboxes/[^/]+/[^/]+/messages", settings.exchange.max_message_bytes)],
    )
    if settings.server.rate_limit:
        app.add_middleware(RateLimitMiddleware, rate=settings.server.rate_limit)
    app.add_middleware(MetricsMiddleware)
    app.add_middleware(RequestIdMiddleware)
    tracing.instrument_app(app)

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["service"], responses={503: {"description": "store unreachable"}})
    async def readyz() -> Any:
        """The store answers."""
        try:
            await asyncio.wait_for(store.ping(), 5)
        except Exception as exc:
            log.warning("readiness check failed: %s", exc)
            return problem_response(Unavailable(str(exc)[:200]).problem())
        return JSONResponse({"status": "ready", "engine": store.dialect.name})

    # Swagger UI over /openapi.json, its files from this server (core/docs_page.py).
    app.router.routes.extend(docs_routes(app.openapi_url or "/openapi.json", title="Mainspring API"))
    app.router.routes.extend(root_routes(openapi_url=app.openapi_url or "/openapi.json", version=__version__))

    gauges = Gauges([read_outbox_gauges, read_alert_gauges, *(face.read_gauges for face in FACES if face.read_gauges is not None)])

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        """Prometheus text format: request metrics, and each face's business metrics read from the store."""
        try:
            await gauges.refresh(ctx)
        except Exception as exc:
            # A lost store must not take the scrape down with it: what was read last is answered.
            log_failure(log, exc, "reading the gauges for /metrics failed")
        return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)

    # Every /v1 route is behind auth, whatever its own dependencies say.
    app.include_router(core_router, dependencies=[Depends(authenticate)], responses=COMMON_PROBLEMS)
    for face in FACES:
        app.include_router(face.router, dependencies=[Depends(authenticate)], responses=COMMON_PROBLEMS)
        for router in face.routers_for(settings) if face.routers_for is not None else ():
            app.include_router(router, dependencies=[Depends(authenticate)], responses=COMMON_PROBLEMS)
    # The dashboard checks the token in its cookie itself (same tokens, `admin` or `ui` scope).
    app.include_router(ui_router)
    problems_in_openapi(app)
    return app
