"""The kill → first acknowledged write figure of the PostgreSQL failover runs, read from a history."""

from __future__ import annotations

from tests.chaos.harness import failover_times
from tests.chaos.history import FAIL, OK, UNKNOWN, Op


def test_the_first_write_counted_is_the_first_acknowledged_one_sent_after_the_kill() -> None:
    fault = Op("nemesis", "pg_failover", "0", OK, {"killed_at": 100.0, "promoted_after_s": 9.5, "synchronous_after_s": 12.0}, start=99.9, end=112.0)
    ops = [
        Op("interactions", "create", "a", OK, start=99.0, end=101.0),  # sent before the kill: not counted
        Op("batching", "submit", "b", UNKNOWN, start=101.0, end=102.0),  # not acknowledged
        Op("machines", "call", "c", FAIL, start=102.0, end=103.0),
        Op("exchange", "round", "d", OK, start=103.0, end=104.0),  # not a write of its own
        Op("machines", "notify", "e", OK, start=105.0, end=110.4),
        Op("exchange", "store", "f", OK, start=109.0, end=109.8),  # sent later, answered first
        fault,
    ]
    assert failover_times(ops) == [{"promoted_after_s": 9.5, "first_write_after_s": 9.8, "synchronous_after_s": 12.0}]


def test_a_failover_with_no_write_after_it_has_no_figure() -> None:
    fault = Op("nemesis", "pg_failover", "0", OK, {"killed_at": 100.0}, start=100.0, end=110.0)
    assert failover_times([fault])[0]["first_write_after_s"] is None
    assert failover_times([Op("nemesis", "pg_failover", "0", UNKNOWN, {}, start=1.0, end=2.0)]) == []
