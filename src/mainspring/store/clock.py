"""The one clock every deadline, timer and window reads.

Times in the store are integers: milliseconds since the Unix epoch, UTC. They compare the same way on
SQLite and PostgreSQL and survive any driver's idea of time zones.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime


class Clock:
    """Wall-clock time in epoch milliseconds."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever time jumps (only a manual clock jumps)."""


class ManualClock(Clock):
    """A clock that moves only when told to, for tests.

    ``advance`` calls the subscribers, so background loops waiting on a deadline re-check at once.
    """

    def __init__(self, start_ms: int | None = None) -> None:
        self._now = start_ms if start_ms is not None else 1_800_000_000_000
        self._subscribers: list[Callable[[], None]] = []

    def now_ms(self) -> int:
        return self._now

    def subscribe(self, callback: Callable[[], None]) -> None:
        self._subscribers.append(callback)

    def advance(self, ms: int) -> int:
        self._now += ms
        for callback in list(self._subscribers):
            callback()
        return self._now

    def set(self, now_ms: int) -> None:
        self._now = now_ms
        for callback in list(self._subscribers):
            callback()


@functools.lru_cache(maxsize=4096)
def _second(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")


_FORMATTED: dict[int, str] = {}
FORMATTED_KEPT = 4096


def format_time(ms: int | None) -> str | None:
    """RFC 3339 UTC with milliseconds, as the API writes every time."""
    if ms is None:
        return None
    # Times written together share their millisecond (a batch's created_at, its lease's updated_at and expiry):
    # a lease of 500 items formats a handful of distinct times 2,000 times, and a dict look-up is a quarter of
    # formatting one (bench/history/2026-11-29-workerloop.md). Its second is formatted once as well.
    text = _FORMATTED.get(ms)
    if text is None:
        if len(_FORMATTED) >= FORMATTED_KEPT:
            _FORMATTED.clear()
        text = _FORMATTED[ms] = _second(ms // 1000) + f"{ms % 1000:03d}Z"
    return text


def parse_time(value: str | datetime) -> int:
    """Epoch milliseconds from an RFC 3339 string or an aware datetime (naive means UTC)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1000)
