"""The retry policy: when to try a failed timer or notification again, and when to give up."""

from __future__ import annotations

import random

from mainspring.machines.settings import RetryPolicy


def next_delay_ms(policy: RetryPolicy, attempts: int, elapsed_ms: int, rng: random.Random | None = None) -> int | None:
    """The wait before the next processor call, or None when the policy is spent.

    ``attempts`` is how many calls have failed so far (1 after the first failure); ``elapsed_ms`` is the time
    since the first failure.
    """
    if attempts < 1:
        raise ValueError("attempts counts failures and starts at 1")
    if policy.max_attempts is not None and attempts >= policy.max_attempts:
        return None
    delay = min(float(policy.max_ms), policy.initial_ms * policy.factor ** (attempts - 1))
    if policy.jitter:
        delay *= 1.0 - policy.jitter * (rng or random).random()
    delay_ms = int(delay)
    if policy.max_total_ms is not None and elapsed_ms + delay_ms > policy.max_total_ms:
        return None
    return delay_ms
