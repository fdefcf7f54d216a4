"""What keeps a browser on another site from using a server it can reach but should not: an open server (no
tokens) on a developer's machine is reachable by every page that developer opens.

A page on another site can send writes without reading the answer (a form, a ``fetch`` in ``no-cors`` mode),
and a page on a name that an attacker makes resolve to 127.0.0.1 (DNS rebinding) is same-origin with the
server as far as the browser knows, so it can read too. Browsers say where a request comes from (``Origin``,
``Sec-Fetch-Site``) and which name they asked for (``Host``); other clients (the CLI, workers, curl) send no
``Origin`` or ``Sec-Fetch-*`` and are not affected unless ``server.allowed_hosts`` is set.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from mainspring.core.errors import CrossSiteRefused
from mainspring.core.settings import ServerSettings

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


_READ = frozenset({b"host", b"origin", b"sec-fetch-site", b"sec-fetch-mode"})


def _headers(scope: Scope) -> dict[bytes, str]:
    """The headers this check reads (every request passes here: not a dict of all of them)."""
    return {key: value.decode("latin-1") for key, value in scope["headers"] if key in _READ}


def host_name(host: str) -> str:
    """The name of a ``Host`` header (or an origin's netloc), without the port or an IPv6 address's brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _name_allowed(name: str, allowed: list[str]) -> bool:
    for pattern in allowed:
        pattern = pattern.lower()
        if pattern == "*" or name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:])):
            return True
    return False


def _default_hosts(settings: ServerSettings) -> list[str]:
    names = list(LOOPBACK_NAMES)
    with_host = settings.host.strip("[]").lower()
    try:
        if not ipaddress.ip_address(with_host).is_unspecified:
            names.append(with_host)
    except ValueError:
        names.append(with_host)  # a name, not an address
    return names


def check_browser_request(scope: Scope, settings: ServerSettings, *, open_server: bool) -> None:
    """Refuse (403 ``cross_site_refused``) a request by a name this server does not answer to, and, on an open
    server, a browser's write from another site."""
    if not open_server and not settings.allowed_hosts:
        return  # a server with tokens and no host list: nothing here to check (its callers prove who they are)
    headers = _headers(scope)
    from_browser = b"origin" in headers or b"sec-fetch-site" in headers or b"sec-fetch-mode" in headers
    if settings.allowed_hosts or (open_server and from_browser):
        name = host_name(headers.get(b"host", ""))
        if not _name_allowed(name, settings.allowed_hosts or _default_hosts(settings)):
            raise CrossSiteRefused(f"this server does not answer to the name {name[:100]!r} (server.allowed_hosts)")
    if not open_server or scope["method"] in SAFE_METHODS or not from_browser:
        return
    origin = headers.get(b"origin")
    if origin is not None:
        if origin.rstrip("/") in settings.allowed_origins:
            return
        if origin == "null" or urlsplit(origin).netloc.lower() != headers.get(b"host", "").lower():
            raise CrossSiteRefused("a page of another site may not write to an open server (server.allowed_origins)")
    elif headers.get(b"sec-fetch-site") not in ("same-origin", "none"):
        raise CrossSiteRefused("a page of another site may not write to an open server (server.allowed_origins)")


class WithHeaders:
    """An ASGI app whose every HTTP answer also carries ``headers`` (a page's CSP, ``X-Frame-Options``), unless
    the answer set them itself."""

    def __init__(self, app: ASGIApp, headers: Mapping[str, str]) -> None:
        self.app = app
        self.headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {key for key, _ in message.get("headers", ())}
                message["headers"] = [*message.get("headers", ()), *(h for h in self.headers if h[0] not in present)]
            await send(message)

        await self.app(scope, receive, send_with_headers)
