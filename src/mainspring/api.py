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
from sqlalchemy import text

from mainspring import __version__
from mainspring.app import App
from mainspring.batching.face import face as batching_face
from mainspring.config import Settings
from mainspring.core import outbox
from mainspring.core.auth import Authenticator, authenticate
from mainspring.core.errors import Unavailable
from mainspring.core.http import (
    COMMON_PROBLEMS,
    BodyLimitMiddleware,
    MetricsMiddleware,
    RateLimitMiddleware,
    install_error_handlers,
    problem_response,
    problems_in_openapi,
)
from mainspring.core.publishers import run_publishers
from mainspring.core.routes import router as core_router
from mainspring.core.runtime import Context, Face, retry_while_unavailable, run_loop
from mainspring.exchange.face import face as exchange_face
from mainspring.interactions.face import face as interactions_face
from mainspring.machines.face import face as machines_face
from mainspring.store import Clock, Store
from mainspring.ui.routes import router as ui_router

log = logging.getLogger("mainspring.server")

FACES: list[Face] = [exchange_face, machines_face, interactions_face, batching_face]


async def sequence_events(ctx: Context) -> None:
    async def step() -> int | None:
        while await outbox.assign_positions(ctx.store) >= outbox.SEQUENCER_BATCH:
            pass
        return None

    if ctx.store.is_postgres:
        await run_loop(ctx, "events-sequencer", step, channel=outbox.SEQUENCER_CHANNEL, poll_ms=200)


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

    async def start_up() -> None:
        """Everything before serving; re-run whole if the store goes away meanwhile (recovery is idempotent)."""
        await store.start()
        authenticator: Authenticator = app.state.authenticator
        if await authenticator.is_open():
            log.warning("no API tokens are configured: the server is OPEN to anyone who can reach it")
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

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["service"], responses={503: {"description": "store unreachable"}})
    async def readyz() -> Any:
        """The store answers."""
        try:
            async with store.read() as conn:
                await asyncio.wait_for(conn.execute(text("SELECT 1")), 5)
        except Exception as exc:
            log.warning("readiness check failed: %s", exc)
            return problem_response(Unavailable(str(exc)[:200]).problem())
        return JSONResponse({"status": "ready", "engine": store.dialect.name})

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        """Prometheus text format."""
        return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)

    # Every /v1 route is behind auth, whatever its own dependencies say.
    app.include_router(core_router, dependencies=[Depends(authenticate)], responses=COMMON_PROBLEMS)
    for face in FACES:
        app.include_router(face.router, dependencies=[Depends(authenticate)], responses=COMMON_PROBLEMS)
    # The dashboard checks the token in its cookie itself (same tokens, `admin` or `ui` scope).
    app.include_router(ui_router)
    problems_in_openapi(app)
    return app
