"""When a failed attempt is tried again: the queue's retry delay (API.md §3).

Attempt n (1, 2, …) that failed — a handler raised or timed out, a worker released ``retry``, or a lease
expired — is due again after ``error_delay_ms`` with ``backoff: "fixed"``, after ``min(error_delay_ms ×
2^(n−1), max_delay_ms)`` with ``"exponential"``; with ``jitter``, after a uniform random delay between 0 and
that. The item fails for good once ``max_attempts`` are spent (the callers decide that).
"""

from __future__ import annotations

import random

from mainspring.interactions.data import QueueRow

# 2^62 ms is millions of years: a longer shift only makes a bigger number to compare with the cap.
_MAX_DOUBLINGS = 62


def retry_delay_ms(q: QueueRow, attempt: int, rng: random.Random | None = None) -> int:
    """The delay before the retry of ``q``'s item whose ``attempt``-th attempt failed."""
    delay = q.error_delay_ms
    if q.backoff == "exponential":
        delay = min(q.max_delay_ms, delay << min(max(attempt - 1, 0), _MAX_DOUBLINGS))
    if q.jitter:
        delay = (rng or random).randint(0, delay)
    return delay
