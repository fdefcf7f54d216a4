"""Errors as types. Each has a stable ``code``; ``api`` maps them all to problem+json in one place."""

from __future__ import annotations

from mainspring.types import JsonInput


class MainspringError(Exception):
    """Base of every error a client may see. Subclasses set ``status`` and ``code``."""

    status: int = 400
    code: str = "bad_request"
    title: str = "Bad request"

    def __init__(self, detail: str | None = None, **extra: JsonInput) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.extra = extra

    def problem(self) -> dict[str, JsonInput]:
        return {
            "type": f"https://mainspring.dev/problems/{self.code}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
            **self.extra,
        }


class InvalidRequest(MainspringError):
    status, code, title = 422, "invalid_request", "Invalid request"


class NotFound(MainspringError):
    status, code, title = 404, "not_found", "Not found"


class Conflict(MainspringError):
    status, code, title = 409, "conflict", "Conflict"


class LeaseLost(Conflict):
    code, title = "lease_lost", "The lease is no longer held with this token"


class TooLarge(MainspringError):
    status, code, title = 413, "too_large", "Request body too large"


class RequestTimeout(MainspringError):
    status, code, title = 408, "request_timeout", "The request body stalled"


class UnsupportedMediaType(MainspringError):
    status, code, title = 415, "unsupported_media_type", "The body's Content-Type is not one this operation takes"


class RateLimited(MainspringError):
    status, code, title = 429, "rate_limited", "Too many requests"


class Unauthenticated(MainspringError):
    status, code, title = 401, "unauthenticated", "A valid bearer token is required"


class Forbidden(MainspringError):
    status, code, title = 403, "forbidden", "The token's scopes do not allow this"


class CrossSiteRefused(Forbidden):
    """A browser on another site (or on a name this server does not answer to) asked an open server."""

    code, title = "cross_site_refused", "Refused a request from another site"


class Unavailable(MainspringError):
    status, code, title = 503, "unavailable", "The store is not reachable"


class AlertNotFound(NotFound):
    code, title = "alert_not_found", "No such alert"


class CannotListen(MainspringError):
    """An address the server must listen on is taken (or not this machine's): fatal at start, before the store."""

    status, code, title = 503, "cannot_listen", "Cannot listen on the address"


class StoreRefused(MainspringError):
    """The database answered but refused the connection: the role, its password or the database is wrong."""

    status, code, title = 503, "store_refused", "The store refused the connection"


class StoreUnreachable(MainspringError):
    """The store did not answer within ``server.startup_wait_ms``."""

    status, code, title = 503, "unreachable", "The store is not reachable"


class ConnectionRefused(MainspringError):
    """``create(…, connection=conn)`` cannot write in that connection's transaction (API.md §6)."""

    status, code, title = 400, "connection_refused", "Cannot write through this connection"


class ForeignConnection(ConnectionRefused):
    """The connection is not to the store's PostgreSQL database, or not a kind Mainspring can drive."""

    code, title = "foreign_connection", "The connection is not to the store's database"


class NeedsPostgres(ConnectionRefused):
    """The store is not PostgreSQL: only there does a create join the caller's transaction."""

    code, title = "connection_needs_postgresql", "Writing in your own transaction needs a PostgreSQL store"
