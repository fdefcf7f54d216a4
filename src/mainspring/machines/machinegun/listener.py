"""Machinegun's own listener: ``/v1/automaton`` and ``/v1/event_sink`` on an address of their own
(``machines.machinegun.listen``), as Machinegun is deployed (port 8022, on the network of the services that
call it), beside the main server. The operations are the same ones the main server serves, through the same
HTTP layer (auth per ``machines.machinegun.auth``, body limits, metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import uvicorn

from mainspring.core.auth import Authenticator
from mainspring.core.http import Api, send_problem
from mainspring.core.runtime import Context
from mainspring.machines.machinegun.automaton import woody_routes

log = logging.getLogger("mainspring.machines.machinegun")

AUTOMATON_PATH, EVENT_SINK_PATH = "/v1/automaton", "/v1/event_sink"


class ListenerApp:
    """The ASGI app of the listener: its two operations, 404 for anything else."""

    def __init__(self, api: Api) -> None:
        self.api = api

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = (scope.get("raw_path") or scope["path"].encode("utf-8")).split(b"?", 1)[0]
        found = self.api.table.find(scope["method"], raw)
        if found is None:
            await send_problem(scope, send, 404, "not_found", "Not found",
                               f"this listener serves POST {AUTOMATON_PATH} and POST {EVENT_SINK_PATH} only")
            return
        await self.api.serve(found[0], found[1], scope, receive, send)


class _Server(uvicorn.Server):
    """A uvicorn server that leaves the process's signals to the main server (which stops this one)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listener_app(ctx: Context) -> ListenerApp:
    settings = ctx.settings
    authenticator = Authenticator(ctx.store, settings.auth.tokens, settings.auth.cache_ms)
    routes = woody_routes(settings, AUTOMATON_PATH, EVENT_SINK_PATH)
    return ListenerApp(Api(ctx, authenticator, routes.operations, max_json_bytes=settings.server.max_json_bytes))


async def run_listener(ctx: Context) -> None:
    """Serve the listener until the server stops."""
    listen = ctx.settings.machines.machinegun.listen
    if listen is None:
        return
    host, port = listen.rsplit(":", 1)
    server = _Server(uvicorn.Config(listener_app(ctx), host=host.strip("[]"), port=int(port), lifespan="off", log_config=None,
                                    access_log=ctx.settings.server.access_log))
    serving = asyncio.create_task(server.serve())
    stopping = asyncio.create_task(ctx.stopping.wait())
    await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not serving.done():
        server.should_exit = True
    stopping.cancel()
    await serving
    if not server.started:
        log.error("Machinegun's listener could not listen on %s (see the log above)", listen)
