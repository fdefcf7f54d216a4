"""The one retry policy of every client (tenacity).

A call that is safe to repeat (reads, PUTs, calls with an idempotency key, calls the contract says answer
the same when repeated) is retried on ``ServiceUnavailable`` — the server could not be reached or answered
502/503/504 — with jittered exponential backoff. A call that is not safe to repeat is retried only when the
request certainly never reached the server (the connection was refused).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TypedDict

from tenacity import retry_if_exception, stop_after_attempt, wait_random_exponential
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from mainspring.client.errors import ServiceUnavailable


class RetryArguments(TypedDict):
    """What ``Retrying`` and ``AsyncRetrying`` are given."""

    retry: retry_base
    stop: stop_base
    wait: wait_base
    reraise: bool


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` in all (1: never retry); waits drawn from a doubling window capped at ``max_wait`` s."""

    attempts: int = 4
    max_wait: float = 2.0

    @functools.cache  # noqa: B019 - a frozen policy has two answers, made once (each call's retry loop starts from them)
    def arguments(self, idempotent: bool) -> RetryArguments:
        """Keyword arguments for ``tenacity.Retrying`` / ``AsyncRetrying`` (tenacity's strategies keep no state:
        every call's retry loop shares them)."""

        def retryable(exc: BaseException) -> bool:
            return isinstance(exc, ServiceUnavailable) and (idempotent or not exc.sent)

        return {
            "retry": retry_if_exception(retryable),
            "stop": stop_after_attempt(max(1, self.attempts)),
            "wait": wait_random_exponential(multiplier=0.05, max=self.max_wait),
            "reraise": True,
        }
