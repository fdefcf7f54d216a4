"""Machinegun's own listener: ``/v1/automaton`` and ``/v1/event_sink`` on an address of their own
(``machines.machinegun.listen``), as Machinegun is deployed (port 8022, on the network of the services that
call it), beside the main server. The operations are the same ones the main server serves, through the same
HTTP layer (auth per ``machines.machinegun.auth``, body limits, metrics).

Under ``mainspring serve --workers N`` every process serves it: each binds the address with
``SO_REUSEPORT`` and the kernel spreads the connections over them, as uvicorn shares the main port. A server
of one process binds it alone, so an address already taken fails loudly."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from mainspring.core.auth import Authenticator
from mainspring.core.errors import CannotListen
from mainspring.core.runtime import SHARED_PORTS, Context, bind_address
from mainspring.machines.machinegun.automaton import woody_routes
from mainspring.web import transport
from mainspring.web.http import Api, send_problem

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
    authenticator = Authenticator(ctx.store, settings.auth.tokens, settings.auth.cache_ms,
                                  open_when_all_revoked=settings.auth.open_when_all_revoked)
    routes = woody_routes(settings, AUTOMATON_PATH, EVENT_SINK_PATH)
    return ListenerApp(Api(ctx, authenticator, routes.operations, max_json_bytes=settings.server.max_json_bytes))


LISTENER_SOCKET = "machinegun:listener-socket"
"""Set in ``Context.extras`` by ``mainspring serve``: the listener's address, bound before the store is opened (a
taken address is fatal at start, docs/machinegun.md)."""


def bind_listener(settings: Any, *, shared: bool = False) -> socket.socket | None:
    """The listener's socket, bound (``CannotListen`` when the address is taken), or None when none is configured."""
    listen = settings.machines.machinegun.listen
    if listen is None:
        return None
    host, port = listen.rsplit(":", 1)
    return bind_address(host, int(port), reuse_port=shared)


async def run_listener(ctx: Context) -> None:
    """Serve the listener until the server stops."""
    listen = ctx.settings.machines.machinegun.listen
    if listen is None:
        return
    sock = ctx.extras.pop(LISTENER_SOCKET, None)
    if sock is None:
        try:
            sock = bind_listener(ctx.settings, shared=bool(ctx.extras.get(SHARED_PORTS)))
        except CannotListen as exc:
            log.error("Machinegun's listener: %s", exc.detail)
            return
    host, port = listen.rsplit(":", 1)
    # The main server's protocol and limits (head size, head and keep-alive timeouts): this port is as exposed.
    server = _Server(transport.uvicorn_config(listener_app(ctx), ctx.settings.server, host=host.strip("[]"), port=int(port),
                                              lifespan="off", backlog=2048))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    stopping = asyncio.create_task(ctx.stopping.wait())
    await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not serving.done():
        server.should_exit = True
    stopping.cancel()
    await serving
    if not server.started:
        log.error("Machinegun's listener could not listen on %s (see the log above)", listen)
