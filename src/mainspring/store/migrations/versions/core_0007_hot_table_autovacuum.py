"""core: autovacuum settings for the hot tables (items and events), chosen from the soak; events by time (issue 26)

PostgreSQL's defaults vacuum a table after 20 % of it is dead: at 10M items that is 2M dead rows before the
first vacuum, bloat that the indexes keep. An item is inserted, updated at least twice (leased, finished) and
deleted by retention, and an event is inserted and deleted by retention: at 500 creates/s the items table
makes ~1,500 dead rows a second (bench/history/2026-11-27-scale2.md, the soak). Vacuumed after 2 % (and 1,000 rows) with ten times
PostgreSQL's default work per round, both stay flat; inserts alone also trigger a vacuum after 2 %, which
keeps the visibility map current for the index-only scans of the counts' ready/scheduled split. SQLite has
no autovacuum to set: nothing there.

``ix_events_at``: retention deleted the oldest events by a Seq Scan and a sort of the whole table every
round (105 ms at 150,000 events in the soak, growing with the table), and the dashboard's throughput chart
reads the last hour of events; both walk this index now.

Cost: ``ALTER TABLE ... SET`` of storage parameters takes a SHARE UPDATE EXCLUSIVE lock for an instant
(writes and reads go on); no rewrite. The index is built CONCURRENTLY on PostgreSQL (writes go on; a run
stopped during the build leaves it INVALID, and the next run builds it again).

Revision ID: core_0007
"""

from alembic import op

from mainspring.store.migrate import create_indexes_concurrently

revision = "core_0007"
down_revision = "core_0006"
branch_labels = None
depends_on = "interactions_0011"

HOT_TABLES = ("interactions", "events")
SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_insert_scale_factor": "0.02",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_limit": "2000",
}


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        op.create_index("ix_events_at", "events", ["at", "type"])
        return
    for table in HOT_TABLES:
        op.execute(f"ALTER TABLE {table} SET ({', '.join(f'{k} = {v}' for k, v in SETTINGS.items())})")
    create_indexes_concurrently(op, "events", [("ix_events_at", ["at", "type"], None)])


def downgrade() -> None:
    op.drop_index("ix_events_at", table_name="events")
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in HOT_TABLES:
        op.execute(f"ALTER TABLE {table} RESET ({', '.join(SETTINGS)})")
