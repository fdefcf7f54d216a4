"""Bearer tokens with scopes. Tokens are stored only as their sha256.

Scopes: ``admin``; ``exchange:send:<addressee>``, ``exchange:receive:<addressee>``; ``machines:<ns>``;
``queues:<queue>``; ``batchers:<name>``; ``ui``; a ``*`` at the end matches any rest.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Request
from sqlalchemy import select

from mainspring.core.errors import Forbidden, NotFound, Unauthenticated
from mainspring.core.tables import api_tokens
from mainspring.store import Store, format_time

log = logging.getLogger("mainspring.auth")

TOKEN_PREFIX = "ms_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


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
            raise Forbidden(f"this token has none of the scopes {scopes!r}")


OPEN = Principal("anonymous", ("admin",), open=True)


class Authenticator:
    """Knows the configured and stored tokens; re-reads the stored ones every ``cache_ms``."""

    def __init__(self, store: Store, configured: list[Any], cache_ms: int) -> None:
        self._store = store
        self._configured = {t.token_sha256: Principal(t.name, tuple(t.scopes)) for t in configured}
        self._cache_ms = cache_ms
        self._stored: dict[str, Principal] = {}
        self._loaded_at: float | None = None

    async def _refresh(self) -> None:
        now = time.monotonic()
        if self._loaded_at is not None and (now - self._loaded_at) * 1000 < self._cache_ms:
            return
        async with self._store.read() as conn:
            rows = (await conn.execute(select(api_tokens).where(api_tokens.c.revoked_at.is_(None)))).all()
        self._stored = {r.token_sha256: Principal(r.name, tuple(r.scopes)) for r in rows}
        self._loaded_at = now

    def invalidate(self) -> None:
        self._loaded_at = None

    async def is_open(self) -> bool:
        await self._refresh()
        return not self._configured and not self._stored

    async def authenticate(self, authorization: str | None) -> Principal:
        if await self.is_open():
            return OPEN
        if not authorization or not authorization.lower().startswith("bearer "):
            raise Unauthenticated()
        digest = hash_token(authorization[7:].strip())
        for known in (self._configured, self._stored):
            for candidate, principal in known.items():
                if hmac.compare_digest(candidate, digest):
                    return principal
        raise Unauthenticated("unknown or revoked token")


async def authenticate(request: Request) -> Principal:
    """FastAPI dependency for every ``/v1`` route: who is calling."""
    principal: Principal = await request.app.state.authenticator.authenticate(request.headers.get("authorization"))
    request.state.principal = principal
    return principal


def requires(template: str) -> Callable[..., Any]:
    """A dependency checking one scope, formatted from the path parameters: ``requires("queues:{queue}")``."""

    async def check(request: Request, principal: Principal = Depends(authenticate)) -> Principal:
        principal.require(template.format(**request.path_params))
        return principal

    return check


async def create_token(store: Store, name: str, scopes: list[str]) -> tuple[str, str]:
    """Store a new token; answers (id, token). The token itself is shown once and never stored."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = uuid.uuid4().hex[:12]
    async with store.transaction() as tx:
        await tx.execute(
            api_tokens.insert().values(
                id=token_id, name=name, token_sha256=hash_token(token), scopes=scopes, created_at=store.now_ms()
            )
        )
    return token_id, token


async def list_tokens(store: Store) -> list[dict[str, Any]]:
    async with store.read() as conn:
        rows = (await conn.execute(select(api_tokens).order_by(api_tokens.c.created_at))).all()
    return [
        {
            "id": r.id,
            "name": r.name,
            "scopes": r.scopes,
            "created_at": format_time(r.created_at),
            "revoked_at": format_time(r.revoked_at),
        }
        for r in rows
    ]


async def revoke_token(store: Store, token_id: str) -> None:
    async with store.transaction() as tx:
        result = await tx.execute(
            api_tokens.update()
            .where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
            .values(revoked_at=store.now_ms())
        )
        if not result.rowcount:
            raise NotFound(f"no active token {token_id}")
