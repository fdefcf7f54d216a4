"""uvicorn's HTTP/1.1 protocol (httptools) with what it leaves unbounded: the size of a request's head and the
time a client may take to send it.

httptools buffers a header line until it ends, so a 100 MB header costs 100 MB before any code of ours sees a
byte, and a connection that never finishes its head (or sends nothing) is kept forever — uvicorn times out only
idle keep-alive connections *between* requests. This protocol counts the head's bytes as they arrive and
answers ``431`` (``connection: close``) past ``server.max_head_bytes``, and closes a connection whose head is not
complete within ``server.head_timeout_ms`` (``408``). It is a module-level class, so that the processes of
``serve --workers N`` import it; ``configure`` sets its limits in each.

Every port Mainspring serves HTTP on (the main server, Machinegun's listener, a worker's health port) gets its
uvicorn config from ``uvicorn_config``, so none of them is left with the stock protocol.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mainspring.core.settings import ServerSettings


def _answer(status: int, reason: str) -> bytes:
    body = f'{{"type":"https://mainspring.dev/problems/{reason}","title":"{reason}","status":{status},"detail":"{reason}","code":"{reason}"}}'
    return (f"HTTP/1.1 {status} {reason.replace('_', ' ')}\r\ncontent-type: application/problem+json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}").encode()


HEADERS_TOO_LARGE = _answer(431, "headers_too_large")
HEAD_TIMEOUT = _answer(408, "request_timeout")


class BoundedHttp(HttpToolsProtocol):
    max_head_bytes = 32 * 1024
    head_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._in_head = True
        self._head_started = 0.0
        self._head_timer: asyncio.TimerHandle | None = None

    def _await_head(self) -> None:
        self._in_head, self._head_bytes = True, 0
        self._head_started = self.loop.time()
        # One timer per connection, not one per request: it stays armed while requests come faster than the
        # timeout, and when it fires it looks at the head being read now (``_head_timed_out``).
        if self._head_timer is None:
            self._head_timer = self.loop.call_at(self._head_started + self.head_timeout_s, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return  # a request is being answered: the next head arms the timer again
        deadline = self._head_started + self.head_timeout_s
        if self.loop.time() < deadline:
            # This head began after the timer was armed (for an earlier one): it has until its own deadline.
            self._head_timer = self.loop.call_at(deadline, self._head_timed_out)
            return
        self.transport.write(HEAD_TIMEOUT)
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        # Still in the head after this chunk: all of it was head (a chunk is at most one read, ~256 KiB).
        self._head_bytes += len(data)
        if self._head_bytes > self.max_head_bytes:
            self.transport.write(HEADERS_TOO_LARGE)
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next request's head: uvicorn's keep-alive timeout closes the connection if none comes, this one
        # if it comes too slowly.
        if not self.transport.is_closing():
            self._await_head()


def configure(settings: ServerSettings) -> type[BoundedHttp]:
    """The protocol class with this server's limits (set on the class: every connection of the process)."""
    BoundedHttp.max_head_bytes = settings.max_head_bytes
    BoundedHttp.head_timeout_s = settings.head_timeout_ms / 1000
    return BoundedHttp


def uvicorn_config(app: Any, settings: ServerSettings, **options: Any) -> uvicorn.Config:
    """The uvicorn config of a port Mainspring serves: the head-bounded protocol with ``settings``' limits,
    its keep-alive, no logging config of uvicorn's own (the process's logging is Mainspring's). ``options``
    are the port's own (address, TLS, workers, lifespan, access log)."""
    options.setdefault("access_log", settings.access_log)
    return uvicorn.Config(app, log_config=None, http=configure(settings),
                          timeout_keep_alive=max(1, round(settings.keep_alive_ms / 1000)), **options)
