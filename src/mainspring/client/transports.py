"""The clients' connections to a server: urllib3 for the sync clients, aiohttp for the async ones.

Chosen by measurement (``bench/client_transports.py``: client CPU per keep-alive call against one local
server, the candidates alternated in one run): urllib3 ~140 µs against httpx ~350 and httpcore ~170 (sync);
aiohttp ~105 µs against httpx ~530 and httpcore ~350 (async). Both keep connections alive in a pool; neither
retries, redirects, keeps cookies or reads proxies from the environment: the retry policy is the clients'
own (tenacity, ``client.policy``), and a Mainspring server is called directly.

A client given an httpx ``transport`` (tests, an ASGI app in-process), or whose server the environment says
to reach through a proxy (``HTTP_PROXY``… and ``NO_PROXY``, as httpx read them), sends through httpx as before.
Every connection answers a :class:`Reply` and raises :class:`Unreachable` when no answer came.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from mainspring.core import tracing
from mainspring.types import JsonData

if TYPE_CHECKING:
    import aiohttp
    import httpx
    import urllib3


@dataclass(frozen=True, slots=True)
class Reply:
    """One HTTP answer, read whole."""

    status_code: int
    content: bytes
    method: str
    path: str
    reason_phrase: str = ""

    def json(self) -> JsonData:
        return cast(JsonData, json.loads(self.content))

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class Unreachable(Exception):
    """No answer came: ``sent`` is False when the request certainly never reached the server."""

    def __init__(self, cause: BaseException, sent: bool) -> None:
        super().__init__(str(cause) or type(cause).__name__)
        self.cause = cause
        self.sent = sent


def query(params: Mapping[str, object] | None) -> str:
    """``?a=1&b=true`` as httpx writes query parameters (booleans in lower case, lists repeated); unset dropped."""
    if not params:
        return ""
    pairs = []
    for key, value in params.items():
        for one in value if isinstance(value, list | tuple) else (value,):
            if one is None:
                continue
            pairs.append((key, "true" if one is True else "false" if one is False else str(one)))
    return "?" + urllib.parse.urlencode(pairs) if pairs else ""


def proxied(base_url: str) -> bool:
    """Whether the environment names a proxy for ``base_url`` (then httpx, which reads it, makes the calls)."""
    parts = urllib.parse.urlsplit(base_url)
    proxies = urllib.request.getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not (parts.hostname and urllib.request.proxy_bypass(parts.hostname))


def _split(base_url: str) -> tuple[str, str]:
    """``http://host:port`` and the path every call goes under (a server behind a prefix), without its last ``/``."""
    parts = urllib.parse.urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")


class AsyncConnection:
    """A keep-alive pool to one server (aiohttp), opened on the first call (aiohttp's session belongs to the
    event loop it was made in)."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float) -> None:
        self.base_url = base_url
        self.origin, self.prefix = _split(base_url)
        self.headers = headers
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[int, aiohttp.ClientTimeout] = {}

    @staticmethod
    def for_url(base_url: str, headers: dict[str, str], timeout: float, transport: httpx.AsyncBaseTransport | None) -> AsyncConnection:
        """The connection a client uses: over ``transport`` through httpx when one is given, else aiohttp."""
        if transport is not None or proxied(base_url):
            return AsyncHttpxConnection(base_url, headers, timeout, transport)
        return AsyncConnection(base_url, headers, timeout)

    def _open(self) -> aiohttp.ClientSession:
        import aiohttp

        # limit=0: as many connections as calls in flight (httpx's default pool would queue beyond 100).
        self._session = aiohttp.ClientSession(
            base_url=self.origin, headers=self.headers, connector=aiohttp.TCPConnector(limit=0),
            cookie_jar=aiohttp.DummyCookieJar(), timeout=self._timeout(0))
        return self._session

    def _timeout(self, wait_ms: int) -> aiohttp.ClientTimeout:
        """No overall deadline: a connect and each read have ``timeout`` s (a long poll's read ``wait_ms`` more)."""
        found = self._timeouts.get(wait_ms)
        if found is None:
            import aiohttp

            found = self._timeouts[wait_ms] = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout, sock_read=self.timeout + wait_ms / 1000)
        return found

    async def request(self, method: str, path: str, *, params: Mapping[str, object] | None = None, headers: dict[str, str] | None = None,
                      content: bytes | None = None, wait_ms: int | None = None) -> Reply:
        import aiohttp

        session = self._session or self._open()
        target = self.prefix + path + query(params)
        timeout = self._timeout(wait_ms) if wait_ms else None
        try:
            if not tracing.enabled():
                return await self._send(session, method, target, headers, content, timeout)
            headers = dict(headers or {})
            with tracing.outgoing(method, self.origin + target, headers):
                return await self._send(session, method, target, headers, content, timeout)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise Unreachable(exc, sent=False) from exc
        except (aiohttp.ClientError, OSError) as exc:  # TimeoutError is an OSError
            raise Unreachable(exc, sent=True) from exc

    @staticmethod
    async def _send(session: aiohttp.ClientSession, method: str, target: str, headers: dict[str, str] | None,
                    content: bytes | None, deadlines: aiohttp.ClientTimeout | None) -> Reply:
        if deadlines is None:
            call = session.request(method, target, headers=headers, data=content, allow_redirects=False)
        else:
            call = session.request(method, target, headers=headers, data=content, allow_redirects=False, timeout=deadlines)
        async with call as answer:
            return Reply(answer.status, await answer.read(), method, target.partition("?")[0], answer.reason or "")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class AsyncHttpxConnection(AsyncConnection):
    """Through httpx: over the transport a client was given (an ASGI app in-process, a test's fake network), or
    through the proxy the environment names."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float, transport: httpx.AsyncBaseTransport | None) -> None:
        import httpx

        super().__init__(base_url, headers, timeout)
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout, transport=transport)

    async def request(self, method: str, path: str, *, params: Mapping[str, object] | None = None, headers: dict[str, str] | None = None,
                      content: bytes | None = None, wait_ms: int | None = None) -> Reply:
        import httpx

        timeout = httpx.Timeout(self.timeout, read=self.timeout + wait_ms / 1000) if wait_ms else httpx.USE_CLIENT_DEFAULT
        try:
            answer = await self._http.request(method, path + query(params), headers=headers, content=content, timeout=timeout)
        except httpx.TransportError as exc:
            raise Unreachable(exc, sent=not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)) from exc
        return Reply(answer.status_code, answer.content, method, path, answer.reason_phrase)

    async def aclose(self) -> None:
        await self._http.aclose()


class SyncConnection:
    """A keep-alive pool to one server (urllib3), safe to share between threads."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float) -> None:
        self.base_url = base_url
        self.origin, self.prefix = _split(base_url)
        self.headers = headers
        self.timeout = timeout
        self._timeouts: dict[int, urllib3.Timeout] = {}
        # Made now (it connects nothing yet), so that threads sharing the client share one pool (not for httpx).
        self._pool: urllib3.HTTPConnectionPool | None = self._open() if type(self) is SyncConnection else None

    @staticmethod
    def for_url(base_url: str, headers: dict[str, str], timeout: float, transport: httpx.BaseTransport | None) -> SyncConnection:
        """The connection a client uses: over ``transport`` through httpx when one is given, else urllib3."""
        if transport is not None or proxied(base_url):
            return SyncHttpxConnection(base_url, headers, timeout, transport)
        return SyncConnection(base_url, headers, timeout)

    def _open(self) -> urllib3.HTTPConnectionPool:
        import urllib3

        # maxsize: connections kept for reuse; more threads at once each get one of their own (block=False).
        self._pool = urllib3.connection_from_url(self.origin, maxsize=16, block=False, retries=False, timeout=self._timeout(0))
        return self._pool

    def _timeout(self, wait_ms: int) -> urllib3.Timeout:
        """A connect and each read have ``timeout`` s (a long poll's read ``wait_ms`` more)."""
        found = self._timeouts.get(wait_ms)
        if found is None:
            import urllib3

            found = self._timeouts[wait_ms] = urllib3.Timeout(connect=self.timeout, read=self.timeout + wait_ms / 1000)
        return found

    def request(self, method: str, path: str, *, params: Mapping[str, object] | None = None, headers: dict[str, str] | None = None,
                content: bytes | None = None, wait_ms: int | None = None) -> Reply:
        import urllib3

        pool = self._pool or self._open()  # again after close()
        target = self.prefix + path + query(params)
        sent = {**self.headers, **headers} if headers else self.headers
        timeout = self._timeout(wait_ms or 0)
        try:
            if not tracing.enabled():
                answer = pool.urlopen(method, target, body=content, headers=sent, redirect=False, timeout=timeout)
            else:
                sent = dict(sent)
                with tracing.outgoing(method, self.origin + target, sent):
                    answer = pool.urlopen(method, target, body=content, headers=sent, redirect=False, timeout=timeout)
        except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError, urllib3.exceptions.EmptyPoolError) as exc:
            raise Unreachable(exc, sent=False) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unreachable(exc, sent=True) from exc
        return Reply(answer.status, answer.data, method, target.partition("?")[0], answer.reason or "")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class SyncHttpxConnection(SyncConnection):
    """Through httpx: over the transport a client was given (a test's fake network, a WSGI app), or through the
    proxy the environment names."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float, transport: httpx.BaseTransport | None) -> None:
        import httpx

        super().__init__(base_url, headers, timeout)
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout, transport=transport)

    def request(self, method: str, path: str, *, params: Mapping[str, object] | None = None, headers: dict[str, str] | None = None,
                content: bytes | None = None, wait_ms: int | None = None) -> Reply:
        import httpx

        timeout = httpx.Timeout(self.timeout, read=self.timeout + wait_ms / 1000) if wait_ms else httpx.USE_CLIENT_DEFAULT
        try:
            answer = self._http.request(method, path + query(params), headers=headers, content=content, timeout=timeout)
        except httpx.TransportError as exc:
            raise Unreachable(exc, sent=not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)) from exc
        return Reply(answer.status_code, answer.content, method, path, answer.reason_phrase)

    def close(self) -> None:
        self._http.close()
