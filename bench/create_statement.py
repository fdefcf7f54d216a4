"""PostgreSQL's CPU per interaction create, statement by statement: what the database spends on the row, its
event and its wake-up, and what each part of that costs (the variants change one thing in a scratch
database of their own).

    .venv/bin/python -m bench.create_statement [--pg URL] [--creates 3000] [--group 4]

Each variant creates ``--creates`` items, ``--group`` per statement (what group commit makes of 8 concurrent
requests here: ~4), through the server's own code (``interactions.data.insert_queued_with_events`` as the
whole of its transaction, one round trip), and reports the database's backends' CPU (utime+stime, every
backend of the scratch database, the LISTEN one included) per item (pg_stat_wal is the whole server's, so
WAL is not counted: on a shared machine other databases write most of it). Variants: ``as shipped``; ``no wake trigger`` (interactions_0003's statement trigger off);
``events unlocked`` (the position from the sequence without the numbering lock — unsafe, for its price);
``no events pkey`` (the events' id index dropped); ``no ON CONFLICT``, ``no events``, ``no NOTIFY`` (the
statement without that part); ``generic plan`` (``plan_cache_mode = force_generic_plan``: the prepared
statement planned once, not at each execution); ``floor`` (a one-row insert into a table without
an index, no event, no NOTIFY: what any commit costs here, per statement); ``sequencer`` (events unnumbered, then numbered by an
UPDATE per statement, as before core_0006). Each variant runs after a ``CHECKPOINT``; on a machine whose other users
request checkpoints every few seconds (CREATE/DROP DATABASE), full-page images weigh on every variant alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
from pathlib import Path

from sqlalchemy import text

from mainspring.interactions.data import NewInteraction, create
from mainspring.store import Store
from mainspring.store.migrate import migrate

SEQUENCER_SQL = (
    "WITH numbered AS (UPDATE events SET position = n.pos FROM (SELECT id, (SELECT COALESCE(MAX(position), 0) "
    "FROM events) + row_number() OVER (ORDER BY id) AS pos FROM events WHERE position IS NULL ORDER BY id "
    "LIMIT 5000) AS n WHERE events.id = n.id RETURNING 1) SELECT count(*) FROM numbered"
)

SHIPPED = str(create._CREATE_WITH_EVENTS_ALONE)
EVENTS_CTE = SHIPPED[SHIPPED.index("ev AS (INSERT INTO events"):SHIPPED.index("FROM ins ORDER BY ins.id) ") + len("FROM ins ORDER BY ins.id) ")]
REWRITES: dict[str, str] = {
    "no ON CONFLICT": SHIPPED.replace(" ON CONFLICT (queue, message_id) DO NOTHING", ""),
    "no events": SHIPPED.replace(", " + EVENTS_CTE, " "),
    "no NOTIFY": SHIPPED.replace("SELECT pg_notify(:pg_channel, channel)", "SELECT channel"),
}
"""Variants that change the statement rather than the schema."""

VARIANTS: dict[str, list[str]] = {
    "as shipped": [],
    "no wake trigger": ["ALTER TABLE interactions DISABLE TRIGGER interactions_wake_after_insert"],
    "events unlocked": ["ALTER TABLE events ALTER COLUMN position SET DEFAULT nextval('events_position_seq')"],
    "no events pkey": ["ALTER TABLE events DROP CONSTRAINT pk_events"],
    **{name: [] for name in REWRITES},
    "generic plan": [],
    "floor: a one-row insert per commit": ["CREATE TABLE bench_floor (n integer)"],
    "sequencer": ["ALTER TABLE events ALTER COLUMN position DROP DEFAULT",
                  "CREATE INDEX ix_events_unpositioned ON events (id) WHERE position IS NULL"],
}


def backends_times(pids: set[int]) -> tuple[float, float]:
    """utime and stime (seconds) of the backends ``pids`` still alive."""
    user = system = 0
    for pid in pids:
        try:
            parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user, system = user + int(parts[11]), system + int(parts[12])
    return user / os.sysconf("SC_CLK_TCK"), system / os.sysconf("SC_CLK_TCK")


def psql(url: str, sql: str) -> str:
    return subprocess.run(["psql", url, "-Atc", sql], capture_output=True, text=True, check=True).stdout.strip()


async def run(admin: str, name: str, ddl: list[str], creates: int, group: int) -> tuple[float, float]:
    database = f"msbench_create_{os.getpid()}"
    psql(admin, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    psql(admin, f'CREATE DATABASE "{database}"')
    url = admin.rsplit("/", 1)[0] + "/" + database
    if name == "generic plan":  # planned once per connection, not at every execution
        psql(admin, f'ALTER DATABASE "{database}" SET plan_cache_mode = force_generic_plan')
    store = Store(url, pool_size=2)
    create._CREATE_WITH_EVENTS_ALONE = text(REWRITES.get(name, SHIPPED)).columns(*create.items.c)
    try:
        await migrate(store)
        await store.start()
        await store.listening()
        async with store.transaction() as tx:
            for statement in ddl:
                await tx.execute(text(statement))
        sequencer, floor = name == "sequencer", name.startswith("floor")
        for _ in range(20):  # warm: statements prepared, pool connected
            await write(store, group, sequencer, floor)
        psql(url, "CHECKPOINT")
        pids = {int(p) for p in psql(admin, f"SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE datname = '{database}'").split()}
        user_before, system_before = backends_times(pids)
        for _ in range(creates // group):
            await write(store, group, sequencer, floor)
        await asyncio.sleep(0.3)
        user_after, system_after = backends_times(pids)
        user, system = user_after - user_before, system_after - system_before
        items = creates // group * group
        return user * 1000 / items, system * 1000 / items
    finally:
        await store.close()
        psql(admin, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


async def write(store: Store, group: int, sequencer: bool, floor: bool) -> None:
    now = store.now_ms()
    if floor:  # the same commit with nothing of Mainspring's in it: no index, no event, no NOTIFY
        async with store.transaction(alone=True) as tx:
            await tx.execute_alone(text("INSERT INTO bench_floor VALUES (1)"))
        return
    async with store.transaction(alone=True) as tx:
        await create.insert_queued_with_events(tx, [NewInteraction("bench", {"n": 1}) for _ in range(group)], now, ["interactions:bench"])
    if sequencer:
        async with store.read() as session:
            await session.execute(text(SEQUENCER_SQL))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--creates", type=int, default=3000)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="rounds over every variant; the median is printed")
    args = parser.parse_args()
    print(f"load average before: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print(f"{args.group} creates per statement")
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeat):  # interleaved, so a busy minute of the shared machine weighs on all alike
        for name, ddl in VARIANTS.items():
            rounds[name].append(asyncio.run(run(args.pg, name, ddl, args.creates, args.group)))
    print("| variant | PostgreSQL CPU per create, median (user + system) | every round |")
    print("| --- | --- | --- |")
    for name, measured in rounds.items():
        user, system = sorted(measured, key=sum)[len(measured) // 2]
        every = ", ".join(f"{u + s:.3f}" for u, s in measured)
        print(f"| {name} | {user + system:.3f} ms ({user:.3f} + {system:.3f}) | {every} |")
    print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
