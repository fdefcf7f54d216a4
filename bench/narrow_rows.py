"""PostgreSQL CPU per item of a lease and its completion: today's rows beside issue 32's narrow rows, same run.

Today an item is one 27-column row with eleven indexes and count triggers, updated in place at the lease and at
the outcome; ``state`` is in the partial indexes' predicates, so neither update is HOT. Issue 32's design keeps
the record apart from what a lease touches: a due item has a row in ``interaction_ready`` (queue, owner,
priority, due, id), a leased one a row in ``interaction_leases`` (id, token, expires, worker); a lease moves a
batch from one to the other with ``DELETE … RETURNING`` feeding ``INSERT`` in one statement, and the record is
written again only at the outcome. This script measures both on the same PostgreSQL, alternated, before any of
it is built:

- **today**: Mainspring's own code (``leasing.lease``, ``leasing.release_many`` with ``Complete``) on a freshly
  migrated store — the one-statement lease and completion paths a busy plain queue takes;
- **narrow**: the same transitions as raw statements on prototype tables in a database migrated the same way
  (the same ``events`` table, its numbering and wake-ups; the counts kept in each statement, not by triggers).

Both take batches of ``--batch`` items, as the worker's best settings do, and print the backends' CPU per item
(``bench.pgcpu.DatabaseCpu``: one database's share while others are busy) and the ratio of each round::

    .venv/bin/python -m bench.narrow_rows --items 10000 --batch 500 --rounds 2

A prototype to decide on, not the schema: what it leaves out (owners, fair shares, limits, parents) is leased as
today, and no code reads its tables.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import time
import uuid
from typing import Any

import asyncpg
from sqlalchemy import text

from bench.pgcpu import DatabaseCpu
from mainspring.interactions import leasing, service
from mainspring.interactions.outcomes import Complete
from mainspring.interactions.settings import InteractionsSettings
from mainspring.store import Store
from mainspring.store.migrate import migrate

CFG = InteractionsSettings()

NARROW_SCHEMA = [
    # The record: today's columns, and only the indexes a reader needs (no partial index on state).
    "CREATE TABLE proto_items (LIKE interactions INCLUDING DEFAULTS)",
    "CREATE SEQUENCE proto_items_id_seq OWNED BY proto_items.id",
    "ALTER TABLE proto_items ALTER COLUMN id SET DEFAULT nextval('proto_items_id_seq'), ADD PRIMARY KEY (id)",
    "CREATE UNIQUE INDEX uq_proto_items_queue_message_id ON proto_items (queue, message_id)",
    "CREATE INDEX ix_proto_items_children ON proto_items (parent_id, name, id) WHERE parent_id IS NOT NULL",
    "CREATE INDEX ix_proto_items_queue_id ON proto_items (queue, id)",
    "CREATE INDEX ix_proto_items_finished ON proto_items (queue, finished_at) WHERE finished_at IS NOT NULL",
    # What a lease reads and writes.
    "CREATE TABLE proto_ready (queue text NOT NULL, owner text NOT NULL, priority integer NOT NULL, due bigint NOT NULL, "
    "id bigint PRIMARY KEY)",
    "CREATE INDEX ix_proto_ready_pick ON proto_ready (queue, priority DESC, due, id)",
    "CREATE TABLE proto_leases (id bigint PRIMARY KEY, queue text NOT NULL, token text NOT NULL, expires bigint NOT NULL, "
    "worker text NOT NULL, attempt integer NOT NULL)",
    "CREATE TABLE proto_counts (queue text NOT NULL, status text NOT NULL, n bigint NOT NULL, PRIMARY KEY (queue, status))",
]

NARROW_LEASE = """
WITH picked AS (
    DELETE FROM proto_ready AS r WHERE r.id IN (
        SELECT id FROM proto_ready WHERE queue = $1 AND due <= $2 ORDER BY priority DESC, due, id LIMIT $3 FOR UPDATE SKIP LOCKED)
    RETURNING r.id, r.queue),
leased AS (
    INSERT INTO proto_leases (id, queue, token, expires, worker, attempt)
    SELECT p.id, p.queue, $4, $5, $6, i.attempts + 1 FROM picked AS p JOIN proto_items AS i ON i.id = p.id
    RETURNING id, attempt),
ev AS (
    INSERT INTO events (type, at, subject_kind, subject_id, data)
    SELECT 'interaction.changed', $2, 'interaction', l.id::text,
           jsonb_build_object('queue', $1::text, 'status', 'processing', 'worker', $6::text) FROM leased AS l ORDER BY l.id),
counted AS (
    INSERT INTO proto_counts AS c (queue, status, n)
    SELECT $1, s.status, s.n FROM (SELECT 'queued' AS status, -count(*) AS n FROM leased
                                   UNION ALL SELECT 'processing', count(*) FROM leased) AS s WHERE s.n <> 0
    ON CONFLICT (queue, status) DO UPDATE SET n = c.n + excluded.n)
SELECT i.*, l.attempt FROM leased AS l JOIN proto_items AS i ON i.id = l.id ORDER BY l.id
"""

NARROW_LEASE_WRITING_RECORD = NARROW_LEASE.replace(
    "counted AS (",
    "recorded AS (UPDATE proto_items AS i SET state = 'processing', leased_at = $2, worker = $6, updated_at = $2 "
    "FROM leased AS l WHERE i.id = l.id), counted AS (",
)

NARROW_COMPLETE = """
WITH done AS (
    DELETE FROM proto_leases AS l USING unnest($1::bigint[], $2::text[]) AS f(id, token)
    WHERE l.id = f.id AND l.token = f.token AND l.expires > $3
    RETURNING l.id, l.queue, l.attempt),
recorded AS (
    UPDATE proto_items AS i SET state = 'completed', result = 'null'::jsonb, attempts = d.attempt, finished_at = $3,
                                updated_at = $3
    FROM done AS d WHERE i.id = d.id RETURNING i.id),
ev AS (
    INSERT INTO events (type, at, subject_kind, subject_id, data)
    SELECT 'interaction.completed', $3, 'interaction', d.id::text,
           jsonb_build_object('queue', d.queue, 'status', 'completed', 'failed', false) FROM done AS d ORDER BY d.id),
counted AS (
    INSERT INTO proto_counts AS c (queue, status, n)
    SELECT d.queue, s.status, s.n * count(*) FROM done AS d CROSS JOIN (VALUES ('processing', -1), ('completed', 1)) AS s(status, n)
    GROUP BY d.queue, s.status, s.n
    ON CONFLICT (queue, status) DO UPDATE SET n = c.n + excluded.n),
wake AS (SELECT pg_notify('mainspring', 'events') WHERE EXISTS (SELECT 1 FROM done))
SELECT count(*) FROM recorded, (SELECT count(*) FROM wake) AS w
"""


# The record stays the truth (written at the lease as today, so no reader changes), but nothing of it is indexed
# by what a lease changes beyond the expiry: the pick order lives in ``proto_ready`` only, the status lists of
# queued items come from there, failed and cancelled ones from a partial index on those states.
READY_APART_SCHEMA = [
    "CREATE TABLE proto_items (LIKE interactions INCLUDING DEFAULTS)",
    "CREATE SEQUENCE proto_items_id_seq OWNED BY proto_items.id",
    "ALTER TABLE proto_items ALTER COLUMN id SET DEFAULT nextval('proto_items_id_seq'), ADD PRIMARY KEY (id)",
    "CREATE UNIQUE INDEX uq_proto_items_queue_message_id ON proto_items (queue, message_id)",
    "CREATE INDEX ix_proto_items_children ON proto_items (parent_id, name, id) WHERE parent_id IS NOT NULL",
    "CREATE INDEX ix_proto_items_queue_id ON proto_items (queue, id)",
    "CREATE INDEX ix_proto_items_finished ON proto_items (queue, finished_at) WHERE finished_at IS NOT NULL",
    "CREATE INDEX ix_proto_items_leased ON proto_items (queue, lease_expires_at) WHERE state = 'processing'",
    "CREATE INDEX ix_proto_items_few ON proto_items (queue, state, id) WHERE state IN ('failed', 'cancelled')",
    "CREATE TABLE proto_ready (queue text NOT NULL, owner text NOT NULL, priority integer NOT NULL, due bigint, "
    "id bigint PRIMARY KEY)",
    "CREATE INDEX ix_proto_ready_pick ON proto_ready (queue, priority DESC, due, id)",
    "CREATE TABLE proto_counts (queue text NOT NULL, status text NOT NULL, n bigint NOT NULL, PRIMARY KEY (queue, status))",
]

READY_APART_LEASE = """
WITH picked AS (
    DELETE FROM proto_ready AS r WHERE r.id IN (
        SELECT id FROM proto_ready WHERE queue = $1 AND due <= $2 ORDER BY priority DESC, due, id LIMIT $3 FOR UPDATE SKIP LOCKED)
    RETURNING r.id),
leased AS (
    UPDATE proto_items AS i SET state = 'processing', lease_token = $4, lease_expires_at = $5, leased_at = $2, worker = $6,
                                wake = false, attempts = i.attempts + 1, updated_at = $2
    FROM picked AS p WHERE i.id = p.id RETURNING i.*),
ev AS (
    INSERT INTO events (type, at, subject_kind, subject_id, data)
    SELECT 'interaction.changed', $2, 'interaction', l.id::text,
           jsonb_build_object('queue', $1::text, 'status', 'processing', 'worker', $6::text) FROM leased AS l ORDER BY l.id),
counted AS (
    INSERT INTO proto_counts AS c (queue, status, n)
    SELECT $1, s.status, s.n FROM (SELECT 'queued' AS status, -count(*) AS n FROM leased
                                   UNION ALL SELECT 'processing', count(*) FROM leased) AS s WHERE s.n <> 0
    ON CONFLICT (queue, status) DO UPDATE SET n = c.n + excluded.n)
SELECT * FROM leased ORDER BY id
"""

READY_APART_COMPLETE = """
WITH done AS (
    UPDATE proto_items AS i SET state = 'completed', result = 'null'::jsonb, next_processing = NULL, lease_token = NULL,
                                lease_expires_at = NULL, finished_at = $3, updated_at = $3
    FROM unnest($1::bigint[], $2::text[]) AS f(id, token)
    WHERE i.id = f.id AND i.lease_token = f.token AND i.lease_expires_at > $3
    RETURNING i.id, i.queue),
ev AS (
    INSERT INTO events (type, at, subject_kind, subject_id, data)
    SELECT 'interaction.completed', $3, 'interaction', d.id::text,
           jsonb_build_object('queue', d.queue, 'status', 'completed', 'failed', false) FROM done AS d ORDER BY d.id),
counted AS (
    INSERT INTO proto_counts AS c (queue, status, n)
    SELECT d.queue, s.status, s.n * count(*) FROM done AS d CROSS JOIN (VALUES ('processing', -1), ('completed', 1)) AS s(status, n)
    GROUP BY d.queue, s.status, s.n
    ON CONFLICT (queue, status) DO UPDATE SET n = c.n + excluded.n),
wake AS (SELECT pg_notify('mainspring', 'events') WHERE EXISTS (SELECT 1 FROM done))
SELECT count(*) FROM done, (SELECT count(*) FROM wake) AS w
"""


async def fresh(admin: str) -> tuple[str, str]:
    name = f"msbench_narrow_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return name, admin.rsplit("/", 1)[0] + "/" + name


async def drop(admin: str, name: str) -> None:
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def today(url: str, items: int, batch: int, *, triggers: bool = True) -> float:
    """PostgreSQL CPU µs per item: Mainspring's lease and completion of ``items`` no-op items (``triggers``
    False: without the count, owner and wake-up triggers of ``interactions``, to see their share)."""
    store = Store(url, pool_size=2)
    await migrate(store)
    if not triggers:
        async with store.transaction() as tx:
            await tx.execute(text("ALTER TABLE interactions DISABLE TRIGGER USER"))
    await store.start()
    try:
        for start in range(0, items + batch, 1000):
            await service.create_many(store, CFG, "bench", [{"data": {"n": i}} for i in range(start, start + 1000)])
        await cycle(store, batch)  # the statements prepared, the connections open, the queue known unlimited
        cpu = DatabaseCpu(url)
        await cpu.start()
        done = 0
        while done < items:
            done += await cycle(store, batch)
        return (await cpu.stop()) / done * 1e6
    finally:
        await store.close()


async def cycle(store: Store, batch: int) -> int:
    leased = await leasing.lease(store, CFG, "bench", "w", batch)
    ids = [(int(i["id"]), i["lease"]["token"], Complete()) for i in leased.items]
    held = await leasing.release_many(store, "bench", ids)
    assert all(held), "a lease was lost"
    return len(ids)


async def narrow(url: str, items: int, batch: int, *, record_at_lease: bool = False, ready_apart: bool = False) -> float:
    """PostgreSQL CPU µs per item: the same transitions on the prototype's narrow rows (``record_at_lease``: the
    record written at the lease as well, as today, to see what leaving it alone saves)."""
    store = Store(url, pool_size=1)
    await migrate(store)
    await store.close()
    conn = await asyncpg.connect(url)
    try:
        for statement in READY_APART_SCHEMA if ready_apart else NARROW_SCHEMA:
            await conn.execute(statement)
        now = int(time.time() * 1000)
        for start in range(0, items + batch, 1000):
            n = 1000
            await conn.execute(
                "WITH ins AS (INSERT INTO proto_items (queue, data, state, next_processing, attempts, created_at, updated_at, owner, priority) "
                "SELECT 'bench', jsonb_build_object('n', g), 'queued', $1, 0, $1, $1, '', 0 FROM generate_series($2::int, $3::int) AS g "
                "RETURNING id, queue, owner, priority, next_processing), "
                "ready AS (INSERT INTO proto_ready SELECT queue, owner, priority, next_processing, id FROM ins), "
                "ev AS (INSERT INTO events (type, at, subject_kind, subject_id, data) SELECT 'interaction.created', $1, 'interaction', "
                "ins.id::text, jsonb_build_object('queue', ins.queue, 'status', 'ready') FROM ins ORDER BY ins.id) "
                "INSERT INTO proto_counts AS c (queue, status, n) SELECT 'bench', 'queued', count(*) FROM ins "
                "ON CONFLICT (queue, status) DO UPDATE SET n = c.n + excluded.n", now, start, start + n - 1)
        if ready_apart:
            lease = await conn.prepare(READY_APART_LEASE)
            complete = await conn.prepare(READY_APART_COMPLETE)
        else:
            lease = await conn.prepare(NARROW_LEASE_WRITING_RECORD if record_at_lease else NARROW_LEASE)
            complete = await conn.prepare(NARROW_COMPLETE)

        async def one() -> int:
            at = int(time.time() * 1000)
            token = uuid.uuid4().hex
            rows = await lease.fetch("bench", at, batch, token, at + 30_000, "w")
            ids = [r["id"] for r in rows]
            done = await complete.fetchval(ids, [token] * len(ids), at + 1)
            assert done == len(ids), "a lease was lost"
            return len(ids)

        await one()
        cpu = DatabaseCpu(url)
        await cpu.start()
        done = 0
        while done < items:
            done += await one()
        spent = await cpu.stop()
        counted = dict(await conn.fetch("SELECT status, n FROM proto_counts"))  # type: ignore[arg-type]
        assert counted["completed"] == done + batch and counted["processing"] == 0, counted
        return spent / done * 1e6
    finally:
        await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ready-apart", action="store_true", help="also the record kept as the truth, the pick order apart")
    parser.add_argument("--parts", action="store_true", help="also today without its triggers, and narrow writing the record at the lease")
    args = parser.parse_args()
    sides: list[tuple[str, Any]] = [("today", today), ("narrow", narrow)]
    if args.parts:
        sides += [("today_no_triggers", functools.partial(today, triggers=False)),
                  ("narrow_record_at_lease", functools.partial(narrow, record_at_lease=True))]
    if args.ready_apart:
        sides.append(("ready_apart", functools.partial(narrow, ready_apart=True)))
    results: list[dict[str, Any]] = []
    for n in range(args.rounds):
        row: dict[str, Any] = {"round": n + 1}
        for side, run in sides if n % 2 == 0 else sides[::-1]:
            name, url = await fresh(args.pg)
            try:
                row[f"{side}_pg_cpu_us_per_item"] = round(await run(url, args.items, args.batch), 1)
            finally:
                await drop(args.pg, name)
        row["ratio"] = round(row["narrow_pg_cpu_us_per_item"] / row["today_pg_cpu_us_per_item"], 2)
        print(json.dumps(row), flush=True)
        results.append(row)


if __name__ == "__main__":
    asyncio.run(main())
