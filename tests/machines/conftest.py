"""Fixtures of the machines tests: a programmable fake processor, in-process and served over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from mainspring.api import create_app
from mainspring.app import App, Registration
from mainspring.config import Settings, load_settings
from mainspring.machines.host import processor_app
from mainspring.store import Clock, Store
from tests.conftest import eventually as eventually  # re-exported: the face's tests import it from here
from tests.conftest import free_port

NS = "orders"


class FakeProcessor:
    """Answers each kind with a default or a handler the test sets; records every request it gets."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []
        self.handlers: dict[str, Callable[[Any, dict[str, Any]], Any]] = {}

    def on(self, kind: str, handler: Callable[[Any, dict[str, Any]], Any]) -> None:
        self.handlers[kind] = handler

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls]

    async def __call__(self, kind: str, args: Any, machine: dict[str, Any]) -> Any:
        self.calls.append((kind, args, machine))
        handler = self.handlers.get(kind)
        if handler is not None:
            result = handler(args, machine)
            if asyncio.iscoroutine(result):
                result = await result
            return result
        if kind == "init":
            return {"events": [{"started": args}], "aux_state": {"n": 0}}
        if kind == "call":
            return {"events": [{"called": args}], "response": {"echo": args}}
        if kind == "timeout":
            return {"events": ["timed out"]}
        if kind == "notification":
            return {"events": [{"notified": args}]}
        return {"events": [{"repaired": args}], "response": "repaired"}


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 200, "sqlite_synchronous": "NORMAL"},
        machines={"lease_margin_ms": 500},
    )


@pytest.fixture
def fake(registry: App) -> FakeProcessor:
    """An in-process processor bound to namespace ``orders``."""
    processor = FakeProcessor()
    registry.processors[NS] = Registration(processor)
    return processor


@pytest.fixture
async def http_fake() -> AsyncIterator[tuple[FakeProcessor, str]]:
    """The same fake served over HTTP by the processor host on a free local port."""
    processor = FakeProcessor()
    async with serve_fake(processor) as url:
        yield processor, url



@contextlib.asynccontextmanager
async def serve_fake(processor: FakeProcessor) -> AsyncIterator[str]:
    """Serve ``processor`` over HTTP through the processor host; yields its URL."""
    async with serve_app(processor_app(processor)) as url:
        yield url


@contextlib.asynccontextmanager
async def serve_app(app: Any) -> AsyncIterator[str]:
    """Serve an ASGI app on a free local port; yields its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn exposes only a flag
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def server_app(settings: Settings, registry: App | None = None, *, background: bool = True, clock: Clock | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """Another server on the test's database, in this process, with its own store and loops."""
    store = Store(settings.server.database_url(), clock=clock or Clock(), pool_size=5, sqlite_synchronous="NORMAL")
    application = create_app(settings, store=store, registry=registry or App(), run_background=background)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://mainspring.test", timeout=30) as client:
            yield client
