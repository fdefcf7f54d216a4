"""The dashboards' latency charts (issue 26): a mean per minute of a bounded sample, the latest finished rows of
each minute, so the overview reads the same few rows at ten million as at ten."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import BigInteger, Column, Index, Integer, MetaData, String, Table

from mainspring.core import data
from mainspring.store import Store

MINUTE = 60_000


@pytest.fixture
async def finished(store: Store) -> Any:
    table = Table("durations_test", MetaData(), Column("id", Integer, primary_key=True), Column("state", String(10)),
                  Column("started", BigInteger), Column("ended", BigInteger), Index("ix_durations_test", "state", "ended"))
    async with store.transaction() as tx:
        await tx.session.conn.run_sync(table.metadata.create_all) if store.is_postgres else table.metadata.create_all(tx.session.conn)
    return table


async def _mean(store: Store, table: Table, since: int, until: int, sample: int = data.DURATION_SAMPLE) -> dict[int, float]:
    async with store.read() as conn:
        return await data.mean_duration_by_bucket(conn, table.c.started, table.c.ended, table.c.state == "done",
                                                  since, until, MINUTE, postgres=store.is_postgres, sample=sample)


async def test_each_minute_is_the_mean_of_its_latest_finished_rows(store: Store, finished: Table) -> None:
    since = 1_764_000_000_000
    until = since + 3 * MINUTE
    rows = [  # (state, ended, duration)
        ("done", since, 999_999),  # not after ``since``: in no bucket
        ("done", since + 1, 10), ("done", since + MINUTE - 1, 30),  # bucket 0: 20
        ("open", since + MINUTE + 5, 999_999),  # not finished
        *[("done", since + 2 * MINUTE + i, 1_000 if i < 50 else 10) for i in range(150)],  # bucket 2: the latest 100
        ("done", until, 7),  # ``until`` itself: the bucket past the last whole one
        ("done", until + 1, 999_999),  # after ``until``
    ]
    async with store.transaction() as tx:
        await tx.execute(finished.insert(), [{"id": n, "state": s, "started": end - d, "ended": end}
                                            for n, (s, end, d) in enumerate(rows)])
    assert await _mean(store, finished, since, until) == {0: 20.0, 2: 10.0, 3: 7.0}
    assert await _mean(store, finished, since, until, sample=150) == {0: 20.0, 2: 340.0, 3: 7.0}
