"""The ASGI app: each face's routes, auth, errors, health, metrics, and the background loops."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from mainspring import __version__
from mainspring.app import App
from mainspring.batching.face import face as batching_face
from mainspring.config import Settings
from mainspring.core import alerts, tracing
from mainspring.core.auth import Authenticator
from mainspring.core.errors import Unavailable
from mainspring.core.logs import configure_logging
from mainspring.core.metrics import Gauges, read_alert_gauges, read_outbox_gauges
from mainspring.core.publishers import prune_published_events, run_publishers
from mainspring.core.runtime import (
    SHARED_PORTS,
    Context,
    fold_kept_counts,
    log_failure,
    retry_while_unavailable,
    run_loop,
    settle_heap,
)
from mainspring.core.tables import event_counts
from mainspring.events_and_alerts import routes as core_routes
from mainspring.exchange.face import face as exchange_face
from mainspring.face import Face
from mainspring.interactions.face import face as interactions_face
from mainspring.machines.face import face as machines_face
from mainspring.store import Clock, Store
from mainspring.store.replication import why_not_synchronous
from mainspring.ui.routes import dashboard, http_error
from mainspring.ui.web import page_headers
from mainspring.web import openapi, transport
from mainspring.web.docs_page import docs_routes, root_routes
from mainspring.web.guard import WithHeaders
from mainspring.web.http import Api, send_problem
from mainspring.web.permissions import PUBLIC
from mainspring.web.routing import Operation, Reply, Routes
from mainspring.workflows.face import face as workflows_face

log = logging.getLogger("mainspring.server")

FACES: list[Face] = [exchange_face, machines_face, interactions_face, batching_face, workflows_face]


async def close_fixed_alerts(ctx: Context) -> None:
    """Close the open alerts whose subject a face finds fixed (a background loop, on every server)."""
    checks = {code: check for face in FACES for code, check in face.fixed_alerts.items()}

    async def step() -> int | None:
        await alerts.close_fixed_alerts(ctx.store, checks)
        return None

    await run_loop(ctx, "alerts-closer", step, channel="alerts-closer", poll_ms=ctx.settings.server.alerts_check_interval_ms)


SERVE_SETTINGS_ENV = "MAINSPRING_SERVE_SETTINGS"
SERVE_APP_ENV = "MAINSPRING_SERVE_APP"


def serve_app() -> Server:
    """The server of one ``mainspring serve --workers N`` process, from the settings the command resolved."""
    import os

    from mainspring.app import load_app

    settings = Settings.model_validate_json(os.environ[SERVE_SETTINGS_ENV])
    transport.configure(settings.server)  # this process's connections
    configure_logging(settings.server.log_level, settings.server.log_format, access_log=settings.server.access_log)
    spec = os.environ.get(SERVE_APP_ENV)
    server = create_app(settings, registry=load_app(spec) if spec else None, own_process=True)
    server.state.context.extras[SHARED_PORTS] = True
    return server


async def warn_unless_sync_replica(store: Store) -> None:
    """``server.require_sync_replica``: say so at start when an acknowledged write may live on one machine."""
    reason = await why_not_synchronous(store)
    if reason is not None:
        log.warning("server.require_sync_replica is set, but %s: an acknowledged write would not survive "
                    "the loss of the primary's machine", reason)


class Server(Starlette):
    """The ASGI app of ``mainspring serve``: the declared operations (``/v1`` and the service endpoints) on
    their own request path, everything else (the dashboard, the API docs' files) on Starlette's routing."""

    def __init__(self, api: Api, *, routes: list[BaseRoute], lifespan: Callable[[Server], contextlib.AbstractAsyncContextManager[None]]) -> None:
        super().__init__(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
        self.api = api
        self._described: dict[str, object] | None = None
        self._entry: ASGIApp = self._dispatch
        if tracing.enabled():
            from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

            self._entry = OpenTelemetryMiddleware(self._dispatch)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._entry(scope, receive, send)

    def openapi(self) -> dict[str, object]:
        """This server's API description (what ``/openapi.json`` answers)."""
        if self._described is None:
            self._described = openapi.build(self.api.operations, title="Mainspring", version=__version__, description=DESCRIPTION)
        return self._described

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or scope["path"].encode("utf-8")
            raw = raw.split(b"?", 1)[0]
            found = self.api.table.find(scope["method"], raw)
            if found is not None:
                await self.api.serve(found[0], found[1], scope, receive, send)
                return
            if raw.startswith(b"/v1/") or raw == b"/v1" or self.api.table.allowed(raw):
                await _no_operation(self.api, scope, raw, send)
                return
        await super().__call__(scope, receive, send)


async def _no_operation(api: Api, scope: Scope, raw: bytes, send: Send) -> None:
    allowed = api.table.allowed(raw)
    if allowed:
        await send_problem(scope, send, 405, "method_not_allowed", "Method not allowed",
                           f"{scope['method']} is not allowed here; allowed: {', '.join(allowed)}", headers={"Allow": ", ".join(allowed)})
    else:
        await send_problem(scope, send, 404, "not_found", "Not found", f"no operation at {scope['path']}")


DESCRIPTION = "Durable processing: exchange, machines, interactions and batching on one store."


def service_routes(ctx: Context, store: Store, document: Callable[[], dict[str, object]]) -> Routes:
    """Health, readiness, metrics and the API description: outside ``/v1``, never behind auth."""
    routes = Routes("", tag="service")
    gauges = Gauges([read_outbox_gauges, read_alert_gauges, *(face.read_gauges for face in FACES if face.read_gauges is not None)])
    described: list[bytes] = []

    @routes.get("/healthz", permission=PUBLIC)
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @routes.get("/readyz", permission=PUBLIC, problems=[Unavailable])
    async def readyz() -> dict[str, str]:
        """The store answers."""
        try:
            await asyncio.wait_for(store.ping(), 5)
        except Exception as exc:
            # The driver's text names hosts, users and databases: the log has it, the public probe does not.
            log.warning("readiness check failed: %s", exc)
            raise Unavailable("the store does not answer (the server log says why)") from None
        return {"status": "ready", "engine": store.dialect.name}

    @routes.get("/metrics", permission=PUBLIC, content={CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}})
    async def metrics() -> Reply:
        """Prometheus text format: request metrics, and each face's business metrics read from the store."""
        try:
            await gauges.refresh(ctx)
        except Exception as exc:
            # A lost store must not take the scrape down with it: what was read last is answered.
            log_failure(log, exc, "reading the gauges for /metrics failed")
        return Reply(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @routes.get("/openapi.json", permission=PUBLIC, in_schema=False)
    async def openapi_json() -> Reply:
        """This API's description (OpenAPI 3.1)."""
        if not described:
            described.append(json.dumps(document()).encode())
        return Reply(described[0], media_type="application/json")

    return routes


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    clock: Clock | None = None,
    registry: App | None = None,
    run_background: bool = True,
    own_process: bool = False,
) -> Server:
    """Build the server. Pass ``store`` (and a ``ManualClock``) in tests; ``run_background=False`` leaves
    the loops to the test. ``own_process``: the server is its process's whole work (``mainspring serve``), so
    the heap start-up made is settled once it is up (``settle_heap``)."""
    store = store or Store(
        settings.server.database_url(),
        clock=clock,
        pool_size=settings.server.pool_size,
        sqlite_synchronous=settings.server.sqlite_synchronous,
    )
    ctx = Context(settings=settings, store=store, registry=registry or App())
    if settings.server.tracing and tracing.enable():
        tracing.instrument_engine(getattr(store.backend.engine, "sync_engine", store.backend.engine))
    authenticator = Authenticator(store, settings.auth.tokens, settings.auth.cache_ms,
                                  open_when_all_revoked=settings.auth.open_when_all_revoked)

    async def start_up() -> None:
        """Everything before serving; re-run whole if the store goes away meanwhile (recovery is idempotent)."""
        await store.start()
        await authenticator.is_open()  # logs whether the server is open
        if settings.server.require_sync_replica:
            await warn_unless_sync_replica(store)
        for face in FACES:
            if face.recover is not None:
                await face.recover(ctx)

    @contextlib.asynccontextmanager
    async def lifespan(app: Server) -> AsyncIterator[None]:
        await retry_while_unavailable("start-up", start_up, settings.server.startup_wait_ms)
        if own_process:
            settle_heap()
        tasks: list[asyncio.Task[None]] = []
        if run_background:
            tasks.append(asyncio.create_task(run_publishers(ctx), name="events-publishers"))
            own = [name for face in FACES if face.publishers_for is not None for name in face.publishers_for(settings)]
            tasks.append(asyncio.create_task(prune_published_events(ctx, own), name="events-retention"))
            tasks.append(asyncio.create_task(close_fixed_alerts(ctx), name="alerts-closer"))
            kept = [event_counts, *(table for face in FACES for table in face.kept_counts)]
            tasks.append(asyncio.create_task(fold_kept_counts(ctx, kept), name="kept-counts"))
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

    # Every /v1 operation is behind auth unless it says otherwise; the service endpoints never are.
    operations: list[Operation] = [*core_routes.operations]
    for face in FACES:
        operations += face.routes.operations
        for extra in face.routes_for(settings) if face.routes_for is not None else ():
            operations += extra.operations
    operations += service_routes(ctx, store, lambda: app.openapi()).operations
    api = Api(ctx, authenticator, operations, max_json_bytes=settings.server.max_json_bytes,
              rate_limit=settings.server.rate_limit, check_answers=settings.server.check_answers)
    app = Server(api, lifespan=lifespan, routes=[
        # Swagger UI over /openapi.json with its files from this server, and / pointing to it and to /ui.
        *docs_routes("/openapi.json", title="Mainspring API"),
        *root_routes(openapi_url="/openapi.json", version=__version__),
        # The dashboard checks the token in its cookie itself (same tokens, `admin` or `ui` scope).
        Mount("", app=WithHeaders(dashboard(), page_headers())),
    ])
    app.state.context = ctx
    app.state.authenticator = authenticator
    return app
