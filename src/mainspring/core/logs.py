"""Logging: human-readable text, or one JSON object a line for log collectors, with the ids of what a line
is about (``request_id``, ``queue``, ``interaction_id``, ``machine``, ``process_id``, …) as fields.

Ids are bound for the duration of a request or a background step with ``bound(**ids)``; every line logged
meanwhile carries them (a context variable, so concurrent requests never mix them up).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import Scope

_context: ContextVar[dict[str, object]] = ContextVar("mainspring_log_context", default={})  # noqa: B039 - never mutated
_request: ContextVar[Scope | None] = ContextVar("mainspring_log_request", default=None)

PATH_FIELDS = {
    "queue": "queue", "interaction_id": "interaction_id", "ns": "namespace", "id": "machine", "process_id": "process_id",
    "addressee": "addressee", "database": "database", "name": "batcher", "package_id": "package_id", "task_id": "task_id",
}
"""Route path parameters → the log fields they become (``{id}`` is only a machine's)."""


def bind_request(scope: Scope, request_id: str) -> None:
    """Lines logged while this request runs carry its id and, once routed, the ids in its path."""
    _request.set(scope)
    bind(request_id=request_id)


@contextlib.contextmanager
def bound(**ids: object) -> Iterator[None]:
    """Log lines written inside carry ``ids`` (those that are not None) as fields."""
    token = _context.set({**_context.get(), **{k: v for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def bind(**ids: object) -> None:
    """Add ``ids`` to the current context until it ends (a request, a task)."""
    _context.set({**_context.get(), **{k: v for k, v in ids.items() if v is not None}})


def current() -> dict[str, object]:
    return _context.get()


def set_current(ids: dict[str, object]) -> None:
    """Make ``ids`` (a fresh dict, never mutated after) the current context's ids, whatever was bound before: a
    long-lived loop that runs one item after another binds each item's ids so."""
    _context.set(ids)


def _request_fields() -> dict[str, object]:
    # Read at log time: the router adds path_params to the request's scope after the middleware bound it.
    scope = _request.get()
    params = scope.get("path_params") if scope is not None else None
    return {PATH_FIELDS[k]: v for k, v in params.items() if k in PATH_FIELDS} if params else {}


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        fields = {**_request_fields(), **_context.get()}
        for key, value in fields.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        record.context = " ".join(f"{k}={v}" for k, v in fields.items())
        return True


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = getattr(record, "context", "")
        return f"{line} [{context}]" if context else line


def _json_formatter() -> logging.Formatter:
    from pythonjsonlogger.json import JsonFormatter

    class _Json(JsonFormatter):
        def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
            return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

        def add_fields(self, log_record: dict[str, object], record: logging.LogRecord, message_dict: dict[str, object]) -> None:
            super().add_fields(log_record, record, message_dict)
            log_record.pop("context", None)

    return _Json("%(asctime)s %(levelname)s %(name)s %(message)s", rename_fields={"levelname": "level", "asctime": "time"})


QUIET = ("httpx", "httpcore", "alembic")
"""Libraries whose INFO lines are noise in a server's log (per request; Alembic's per revision: the store
logs one line when it migrates)."""


def configure_logging(level: str = "INFO", fmt: str = "text", *, access_log: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_json_formatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(_ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = not access_log
    for name in QUIET:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
