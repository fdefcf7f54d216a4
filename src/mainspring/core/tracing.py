"""OpenTelemetry traces (the extra ``mainspring[otel]``, switched on by ``server.tracing``).

What is traced: every request (a server span), every store statement (a child span), every background step
(a span of its own), outgoing HTTP to processors and webhooks (with ``traceparent`` sent along: webhooks
through the httpx instrumentation, processors through ``outgoing``), and every
interaction handler run — in a span linked to the request that created the interaction, whose
``traceparent`` the interaction keeps.

Spans go to the process's tracer provider: one the embedding code or ``opentelemetry-instrument`` set up,
else one that exports over OTLP/HTTP as the standard ``OTEL_EXPORTER_OTLP_*`` variables say.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from starlette.applications import Starlette

log = logging.getLogger("mainspring.tracing")

TRACER = "mainspring"
_enabled = False


def enabled() -> bool:
    return _enabled


def enable() -> bool:
    """Switch tracing on for this process; False (and a warning) when OpenTelemetry is not installed."""
    global _enabled
    if _enabled:
        return True
    try:
        from opentelemetry import trace
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    except ImportError:
        log.warning("server.tracing is on but OpenTelemetry is not installed: pip install 'mainspring[otel]'")
        return False
    if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
        _default_provider()
    HTTPXClientInstrumentor().instrument()
    _enabled = True
    return True


def _default_provider() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "mainspring"}))
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    except ImportError:
        log.warning("no OTLP exporter installed: spans are made but not sent anywhere")
    trace.set_tracer_provider(provider)


def instrument_app(app: Starlette) -> None:
    """Every request to ``app`` (a Starlette/FastAPI app) becomes a server span."""
    if not _enabled:
        return
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    app.add_middleware(OpenTelemetryMiddleware)


def instrument_engine(sync_engine: Any) -> None:
    """Every statement of ``sync_engine`` becomes a child span of whatever span is current."""
    if not _enabled or getattr(sync_engine, "_mainspring_traced", False):
        return
    from opentelemetry import metrics, trace
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer

    # One tracer per engine (the instrumentor's own entry point instruments the first engine only, and its
    # declared range stops below SQLAlchemy 2.1, whose engine events it uses unchanged).
    usage = metrics.get_meter(TRACER).create_up_down_counter("db.client.connections.usage")
    EngineTracer(trace.get_tracer("opentelemetry.instrumentation.sqlalchemy"), sync_engine, usage)
    sync_engine._mainspring_traced = True


@contextlib.contextmanager
def span(name: str, *, links_to: str | None = None, **attributes: str | bool | int | float | None) -> Iterator[None]:
    """A span around a background step or a handler run; ``links_to`` is a ``traceparent`` to link it to
    (the request that caused the work). Nothing at all when tracing is off."""
    if not _enabled:
        yield
        return
    from opentelemetry import trace
    from opentelemetry.trace import Link
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    links = []
    if links_to:
        linked = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": links_to})).get_span_context()
        if linked.is_valid:
            links.append(Link(linked))
    clean = {k: v for k, v in attributes.items() if v is not None}
    with trace.get_tracer(TRACER).start_as_current_span(name, links=links, attributes=clean):
        yield


@contextlib.contextmanager
def outgoing(method: str, url: str, headers: dict[str, str]) -> Iterator[Span | None]:
    """A client span around an outgoing HTTP request not sent through httpx (whose calls the instrumentation
    traces already), with the span's ``traceparent`` put into ``headers``; yields the span, to record the
    answer's status on (None when tracing is off)."""
    if not _enabled:
        yield None
        return
    from opentelemetry import propagate, trace

    attributes = {"http.request.method": method, "url.full": url}
    with trace.get_tracer(TRACER).start_as_current_span(method, kind=trace.SpanKind.CLIENT, attributes=attributes) as current:
        propagate.inject(headers)
        yield current


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span (to keep with work started now), or None."""
    if not _enabled:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")
