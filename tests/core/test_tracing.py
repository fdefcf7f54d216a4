"""OpenTelemetry: request spans with store statements as children, background steps, and a handler run
linked to the request that created its interaction. Checked with the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mainspring.api import create_app
from mainspring.app import App
from mainspring.config import load_settings
from mainspring.store import Store
from tests.conftest import eventually

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> Iterator[None]:
    """One SDK provider for the process (OpenTelemetry lets it be set once)."""
    if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
        sdk = TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(sdk)
    yield


@contextlib.asynccontextmanager
async def traced_server(database_url: str, tmp_path: Path, registry: App) -> AsyncIterator[httpx.AsyncClient]:
    settings = load_settings(None, server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 100, "tracing": True})
    store = Store(database_url)
    app = create_app(settings, store=store, registry=registry)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            EXPORTER.clear()
            yield client


@pytest.fixture
async def traced(database_url: str, tmp_path: Path, registry: App) -> AsyncIterator[httpx.AsyncClient]:
    async with traced_server(database_url, tmp_path, registry) as client:
        yield client


async def test_a_request_is_a_span_with_its_store_statements_inside(traced: httpx.AsyncClient) -> None:
    assert (await traced.post("/v1/queues/q/interactions", json={"data": 1})).status_code == 201
    spans = EXPORTER.get_finished_spans()
    (request,) = [s for s in spans if s.kind == trace.SpanKind.SERVER and "interactions" in s.name]
    statements = [s for s in spans if s.attributes and "db.statement" in s.attributes]
    assert any(s.context.trace_id == request.context.trace_id for s in statements)
    assert any("INSERT INTO interactions" in str(s.attributes["db.statement"]) for s in statements)


async def test_a_handler_runs_in_a_span_linked_to_the_request_that_created_its_interaction(
    registry: App, database_url: str, tmp_path: Path
) -> None:
    handled = asyncio.Event()

    @registry.queue("traced")
    async def handle(item: Any) -> None:
        handled.set()

    async with traced_server(database_url, tmp_path, registry) as client:  # started after the handler is registered
        created = await client.post("/v1/queues/traced/interactions", json={"data": 1})
        assert created.status_code == 201 and created.json()["trace_parent"]
        await asyncio.wait_for(handled.wait(), 10)

        async def handler_span() -> Any:
            return next((s for s in EXPORTER.get_finished_spans() if s.name == "interaction traced"), None)

        run = await eventually(handler_span, within_s=10, what="the handler's span")
    (creating,) = [s for s in EXPORTER.get_finished_spans() if s.kind == trace.SpanKind.SERVER and "traced" in s.name]
    assert [link.context.trace_id for link in run.links] == [creating.context.trace_id]
    assert run.context.trace_id != creating.context.trace_id


async def test_background_steps_are_spans(traced: httpx.AsyncClient) -> None:
    async def stepped() -> bool:
        return any(s.name.startswith("step ") for s in EXPORTER.get_finished_spans())

    await eventually(stepped, within_s=10, what="a background step span")


async def test_a_call_to_an_http_processor_is_a_client_span_whose_traceparent_the_processor_receives(traced: httpx.AsyncClient) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from tests.machines.conftest import serve_app

    received: list[str | None] = []

    async def processor(request: Request) -> JSONResponse:
        received.append(request.headers.get("traceparent"))
        return JSONResponse({"events": ["e"], "response": "ok"})

    async with serve_app(Starlette(routes=[Route("/", processor, methods=["POST"])])) as url:
        assert (await traced.put("/v1/namespaces/remote", json={"processor": {"url": url}})).status_code == 200
        assert (await traced.post("/v1/namespaces/remote/machines", json={"id": "m1"})).status_code == 201
    spans = EXPORTER.get_finished_spans()
    (request,) = [s for s in spans if s.kind == trace.SpanKind.SERVER and s.name.startswith("POST /v1/namespaces")]
    (outgoing,) = [s for s in spans if s.kind == trace.SpanKind.CLIENT and s.attributes and s.attributes.get("url.full") == url]
    assert outgoing.context.trace_id == request.context.trace_id
    assert outgoing.attributes["http.response.status_code"] == 200
    assert [value.split("-")[1:3] for value in received if value] == [[f"{outgoing.context.trace_id:032x}", f"{outgoing.context.span_id:016x}"]]
