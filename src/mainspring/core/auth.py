"""Bearer tokens with scopes. Tokens are stored only as their sha256.

Scopes: ``admin``; ``exchange:send:<addressee>``, ``exchange:receive:<addressee>``; ``machines:<ns>``;
``queues:<queue>``; ``batchers:<name>``; ``ui``; a ``*`` at the end matches any rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypedDict

from mainspring.core import data
from mainspring.core.errors import Forbidden, NotFound, Unauthenticated
from mainspring.core.settings import AuthSettings, TokenConfig
from mainspring.store import Store, format_time
from mainspring.store.notify import Waiter

log = logging.getLogger("mainspring.auth")

TOKEN_PREFIX = "ms_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization`` header as HTTP defines it: the scheme in any case, whitespace around
    and between ignored; None when there is no bearer token."""
    parts = (authorization or "").split(None, 1)
    return parts[1].strip() if len(parts) == 2 and parts[0].lower() == "bearer" else None


def scope_allows(granted: str, required: str) -> bool:
    if granted == "admin" or granted == required:
        return True
    return granted.endswith("*") and required.startswith(granted[:-1])


@dataclass(frozen=True)
class Principal:
    name: str
    scopes: tuple[str, ...]
    open: bool = False

    def allows(self, scope: str) -> bool:
        return self.open or any(scope_allows(g, scope) for g in self.scopes)

    def require(self, scope: str) -> None:
        if not self.allows(scope):
            raise Forbidden(f"this token does not have scope {scope!r}")

    def require_any(self, scopes: Iterable[str]) -> None:
        scopes = list(scopes)
        if not any(self.allows(s) for s in scopes):
            raise Forbidden(f"this token has none of the scopes {', '.join(scopes)}")


OPEN = Principal("anonymous", ("admin",), open=True)


def open_without_token(configured: bool, active: bool, ever_stored: bool, open_when_all_revoked: bool) -> bool:
    """Whether a server serves requests without a token: only while it never had one, unless the operator
    opened a server whose tokens were all revoked on purpose (``auth.open_when_all_revoked``)."""
    if configured or active:
        return False
    return not ever_stored or open_when_all_revoked


async def server_state(store: Store, auth: AuthSettings) -> str:
    """What servers on ``store`` with the ``auth`` settings do now (what the ``token`` commands tell): ``open``
    (serve everyone), ``closed`` (serve valid tokens), or ``locked`` (closed, with no valid token left)."""
    async with store.read() as conn:
        active = bool(await data.active_tokens(conn))
        ever_stored = active or await data.any_token_stored(conn)
    if open_without_token(bool(auth.tokens), active, ever_stored, auth.open_when_all_revoked):
        return "open"
    return "closed" if auth.tokens or active else "locked"


TOKENS_CHANNEL = "auth-tokens"
"""Signalled when a stored token is created or revoked, on every server."""


class Authenticator:
    """Knows the configured and stored tokens without asking the store on the request path.

    The stored ones are re-read when a token is created or revoked (a wake-up on ``TOKENS_CHANNEL``, which
    reaches other servers through NOTIFY), in the background once half of ``cache_ms`` has passed, and
    before answering once all of it has (the backstop should a wake-up be lost).

    Open (everyone is ``admin``) only while no token was ever configured or stored: revoking the last stored
    token leaves the server closed unless ``open_when_all_revoked`` says otherwise. Each change between open and
    closed is logged as a warning, on every server, when it notices it."""

    def __init__(self, store: Store, configured: list[TokenConfig], cache_ms: int, *, open_when_all_revoked: bool = False) -> None:
        self._store = store
        self._configured = {t.token_sha256: Principal(t.name, tuple(t.scopes)) for t in configured}
        self._cache_ms = cache_ms
        self._open_when_all_revoked = open_when_all_revoked
        self._stored: dict[str, Principal] = {}
        self._had_stored = False
        self._state: str | None = None
        self._loaded_at: float | None = None
        self._changed: Waiter | None = None
        self._background: asyncio.Task[None] | None = None

    async def _refresh(self) -> None:
        changed = self._store.notifier.waiter(TOKENS_CHANNEL)
        loaded_at = time.monotonic()
        async with self._store.read() as conn:
            tokens = await data.active_tokens(conn)
            had_stored = bool(tokens) or await data.any_token_stored(conn)
        self._stored = {t.token_sha256: Principal(t.name, tuple(t.scopes)) for t in tokens}
        self._had_stored = had_stored
        self._loaded_at = loaded_at
        self._changed = changed
        self._say_state()

    def _open_now(self) -> bool:
        return open_without_token(bool(self._configured), bool(self._stored), self._had_stored, self._open_when_all_revoked)

    def _say_state(self) -> None:
        """Log the open or closed state when it is first known and whenever it changes: an operator must never
        learn from an attacker that the server opened or closed."""
        if self._open_now():
            state = "open"
        else:
            state = "closed" if self._configured or self._stored else "locked"
        before, self._state = self._state, state
        if state == before:
            return
        if state == "open":
            why = ("every stored token is revoked and auth.open_when_all_revoked is set" if self._had_stored
                   else "no API tokens are configured or stored")
            log.warning("the server is OPEN to anyone who can reach it: %s", why)
        elif state == "locked":
            log.warning("every stored token is revoked: the server is CLOSED and refuses every request until a "
                        "token is created (mainspring token create), or auth.open_when_all_revoked is set")
        elif before is not None:
            log.warning("the server is now CLOSED: a token was created, and every request needs one")

    async def _refresh_quietly(self) -> None:
        with contextlib.suppress(Exception):
            await self._refresh()

    async def _current(self) -> None:
        loaded_at, changed = self._loaded_at, self._changed
        age_ms = None if loaded_at is None else (time.monotonic() - loaded_at) * 1000
        if age_ms is None or age_ms >= self._cache_ms or (changed is not None and changed.signalled):
            await self._refresh()
        elif age_ms >= self._cache_ms / 2 and (self._background is None or self._background.done()):
            self._background = asyncio.create_task(self._refresh_quietly(), name="auth-tokens-refresh")

    def invalidate(self) -> None:
        self._loaded_at = None

    async def is_open(self) -> bool:
        await self._current()
        return self._open_now()

    def known_token(self, authorization: str | None) -> str | None:
        """The sha256 of the request's token when it is a valid one (from the current copy), else None: what
        the rate limit counts a request against (the same token however it is written)."""
        token = bearer_token(authorization)
        if token is None:
            return None
        digest = hash_token(token)
        return digest if digest in self._configured or digest in self._stored else None

    async def authenticate(self, authorization: str | None) -> Principal:
        if await self.is_open():
            return OPEN
        token = bearer_token(authorization)
        if token is None:
            raise Unauthenticated()
        digest = hash_token(token)
        for known in (self._configured, self._stored):
            for candidate, principal in known.items():
                if hmac.compare_digest(candidate, digest):
                    return principal
        # Operators see refused tokens (a revoked one still in use, a probe); the token itself never is logged.
        log.info("refused a request with an unknown or revoked token")
        raise Unauthenticated("unknown or revoked token")


async def create_token(store: Store, name: str, scopes: list[str]) -> tuple[str, str]:
    """Store a new token; answers (id, token). The token itself is shown once and never stored."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = data.Token(uuid.uuid4().hex[:12], name, hash_token(token), scopes, store.now_ms(), None)
    async with store.transaction() as tx:
        await data.insert_token(tx, record)
        tx.notify(TOKENS_CHANNEL)
    return record.id, token


class TokenView(TypedDict):
    """A stored token as ``token list`` shows it (never the token itself)."""

    id: str
    name: str
    scopes: list[str]
    created_at: str | None
    revoked_at: str | None


async def list_tokens(store: Store) -> list[TokenView]:
    async with store.read() as conn:
        tokens = await data.all_tokens(conn)
    return [
        {
            "id": t.id,
            "name": t.name,
            "scopes": t.scopes,
            "created_at": format_time(t.created_at),
            "revoked_at": format_time(t.revoked_at),
        }
        for t in tokens
    ]


async def revoke_token(store: Store, token_id: str) -> None:
    async with store.transaction() as tx:
        if not await data.revoke_token(tx, token_id, store.now_ms()):
            raise NotFound(f"no active token {token_id}")
        tx.notify(TOKENS_CHANNEL)
