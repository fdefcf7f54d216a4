"""What a handler (or a worker over HTTP) says happened to an interaction it held.

A handler returns one of these; any other return value means ``Complete(value)``, and a raised exception
means ``Retry(error)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Complete:
    """Finished successfully with ``result``."""

    result: Any = None


@dataclass(frozen=True)
class Fail:
    """Finished unsuccessfully for good; ``error`` says why."""

    error: str
    detail: dict[str, Any] | None = None
    """What the handler raised, when it raised: ``{"type", "message", "traceback"}`` (bounded)."""


@dataclass(frozen=True)
class Repeat:
    """Process again at epoch ms ``at``, or ``in_ms`` from now."""

    at: int | None = None
    in_ms: int | None = None


@dataclass(frozen=True)
class Wait:
    """Nothing due: wait for a child to finish or for an external change."""


@dataclass(frozen=True)
class Retry:
    """This attempt failed: try again after the queue's retry delay (``backoff`` of ``error_delay_ms``; failed
    once attempts are spent)."""

    error: str
    detail: dict[str, Any] | None = None
    """What the handler raised, when it raised: ``{"type", "message", "traceback"}`` (bounded)."""


Outcome = Complete | Fail | Repeat | Wait | Retry

_COMPLETED = Complete()
"""What a handler that returns nothing (most do) says: one, shared (outcomes are frozen)."""


def as_outcome(value: Any) -> Outcome:
    """A handler's return value as an outcome."""
    if value is None:
        return _COMPLETED
    if isinstance(value, Complete | Fail | Repeat | Wait | Retry):
        return value
    return Complete(value)
