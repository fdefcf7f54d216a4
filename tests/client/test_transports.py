"""The clients over the network (urllib3 sync, aiohttp async): keep-alive, what is sent, and what a failure raises."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from mainspring.client import (
    AsyncBatchingClient,
    AsyncInteractionsClient,
    BatchingClient,
    InteractionsClient,
    NotFound,
    ServiceUnavailable,
)


class Recorder(BaseHTTPRequestHandler):
    """Answers every call with what it received; ``/drop`` closes the connection unanswered, ``/hang`` never answers."""

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]]
    connections: set[int]
    release: threading.Event

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers.items()), "body": body})
        self.connections.add(id(self.connection))
        if self.path.startswith("/drop"):
            self.close_connection = True
            return
        if self.path.startswith("/hang"):
            self.release.wait(5)
            self.close_connection = True
            return
        status = 404 if self.path.startswith("/missing") else 200
        out = json.dumps({"code": "interaction_not_found", "detail": "no such"} if status == 404 else {"echo": self.path}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[Recorder]]]:
    handler = type("Handler", (Recorder,), {"seen": [], "connections": set(), "release": threading.Event()})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    handler.release.set()
    httpd.shutdown()
    httpd.server_close()


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_the_sync_client_reuses_one_connection_and_sends_the_token_the_query_and_json(server: tuple[str, type[Recorder]]) -> None:
    url, handler = server
    with InteractionsClient(url, token="ms_t") as client:
        for _ in range(3):
            client._json("GET", "/x", idempotent=True, params={"a": True, "b": None, "n": 2})
        assert client._json("POST", "/y", idempotent=False, json={"é": 1}) == {"echo": "/y"}
    assert [s["path"] for s in handler.seen] == ["/x?a=true&n=2"] * 3 + ["/y"]
    assert len(handler.connections) == 1
    posted = handler.seen[-1]
    assert posted["headers"]["Authorization"] == "Bearer ms_t"
    assert posted["headers"]["content-type"] == "application/json"
    assert json.loads(posted["body"]) == {"é": 1}


async def test_the_async_client_reuses_one_connection_and_sends_the_token_the_query_and_json(server: tuple[str, type[Recorder]]) -> None:
    url, handler = server
    async with AsyncInteractionsClient(url, token="ms_t") as client:
        for _ in range(3):
            await client._json("GET", "/x", idempotent=True, params={"a": False, "b": None})
        assert await client._json("POST", "/y", idempotent=False, json=[1]) == {"echo": "/y"}
    assert [s["path"] for s in handler.seen] == ["/x?a=false"] * 3 + ["/y"]
    assert len(handler.connections) == 1
    assert handler.seen[-1]["headers"]["Authorization"] == "Bearer ms_t"
    assert json.loads(handler.seen[-1]["body"]) == [1]


def test_a_sync_call_to_a_closed_port_is_service_unavailable_never_sent() -> None:
    with BatchingClient(closed_port(), attempts=2, max_wait=0.001) as client, pytest.raises(ServiceUnavailable) as raised:
        client._json("POST", "/x", idempotent=False)
    assert raised.value.sent is False
    assert raised.value.code == "unreachable"


async def test_an_async_call_to_a_closed_port_is_service_unavailable_never_sent() -> None:
    async with AsyncBatchingClient(closed_port(), attempts=2, max_wait=0.001) as client:
        with pytest.raises(ServiceUnavailable) as raised:
            await client._json("POST", "/x", idempotent=False)
    assert raised.value.sent is False


def test_a_sync_unsafe_call_whose_connection_drops_unanswered_is_not_sent_again(server: tuple[str, type[Recorder]]) -> None:
    url, handler = server
    with BatchingClient(url, attempts=3, max_wait=0.001) as client, pytest.raises(ServiceUnavailable) as raised:
        client._json("POST", "/drop", idempotent=False)
    assert raised.value.sent is True
    assert len(handler.seen) == 1


async def test_an_async_safe_call_whose_connection_drops_unanswered_is_sent_again(server: tuple[str, type[Recorder]]) -> None:
    url, handler = server
    async with AsyncBatchingClient(url, attempts=3, max_wait=0.001) as client:
        with pytest.raises(ServiceUnavailable) as raised:
            await client._json("POST", "/drop", idempotent=True)  # a POST with an idempotency key
    assert raised.value.sent is True
    assert len(handler.seen) == 3


def test_a_sync_call_with_no_answer_within_the_timeout_is_service_unavailable(server: tuple[str, type[Recorder]]) -> None:
    url, _ = server
    with BatchingClient(url, timeout=0.2, attempts=1) as client, pytest.raises(ServiceUnavailable) as raised:
        client._json("GET", "/hang", idempotent=True)
    assert raised.value.sent is True


async def test_an_async_call_with_no_answer_within_the_timeout_is_service_unavailable(server: tuple[str, type[Recorder]]) -> None:
    url, _ = server
    async with AsyncBatchingClient(url, timeout=0.2, attempts=1) as client:
        with pytest.raises(ServiceUnavailable) as raised:
            await client._json("GET", "/hang", idempotent=True)
    assert raised.value.sent is True


def test_a_base_url_with_a_path_sends_every_call_under_it(server: tuple[str, type[Recorder]]) -> None:
    url, handler = server
    with InteractionsClient(url + "/prefix/") as client:
        client._json("GET", "/x", idempotent=True)
    assert handler.seen[0]["path"] == "/prefix/x"


async def test_a_404_problem_with_a_code_is_that_error_over_the_network(server: tuple[str, type[Recorder]]) -> None:
    url, _ = server
    async with AsyncInteractionsClient(url) as client:
        with pytest.raises(NotFound) as raised:
            await client._json("GET", "/missing", idempotent=True)
    assert raised.value.code == "interaction_not_found"


def test_a_server_the_environment_names_a_proxy_for_is_called_through_that_proxy(server: tuple[str, type[Recorder]], monkeypatch: Any) -> None:
    proxy, handler = server
    monkeypatch.setenv("HTTP_PROXY", proxy)
    monkeypatch.setenv("NO_PROXY", "")
    with InteractionsClient("http://mainspring.invalid:8080") as client:
        client._json("GET", "/x", idempotent=True)
    assert handler.seen[0]["path"] == "http://mainspring.invalid:8080/x"  # the absolute form: a proxy's request
