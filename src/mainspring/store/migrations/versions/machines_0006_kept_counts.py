"""machines: counts by namespace and status kept with the writes; due timers on an index

Counting machines by status read every row: a scan on the overview and every /metrics scrape, growing with
the table (issue 26). ``machine_counts`` is kept by triggers (``store.counts``, the mechanism of
interactions_0011). Cost on a big table: the triggers are created and the counts filled in one transaction
that holds a SHARE ROW EXCLUSIVE lock on ``machines`` (writes wait, reads do not) for one scan of the table
(docs/operations.md has the measured time).

``/metrics`` counts the due timers of working machines per namespace: a scan of every working machine
(133 ms at 1M); ``ix_machines_timers`` holds only working machines with a timer, by due time (built
CONCURRENTLY on PostgreSQL: writes go on).

Revision ID: machines_0006
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.counts import KeptCount, create_counts_table, drop_counts_table
from mainspring.store.migrate import create_indexes_concurrently

revision = "machines_0006"
down_revision = "machines_0005"
branch_labels = None
depends_on = None

KEPT = [KeptCount("machine_counts", "machines", "machines", status="status", group="namespace")]


TIMERS = ("ix_machines_timers", ["timer_at", "namespace"], "status = 'working' AND timer_at IS NOT NULL")


def upgrade() -> None:
    bind = op.get_bind()
    # A run stopped during the index build has committed the counts: the next run builds the index only.
    if not sa.inspect(bind).has_table("machine_counts"):
        create_counts_table(op, "machine_counts", KEPT)
    if bind.dialect.name == "postgresql":
        create_indexes_concurrently(op, "machines", [TIMERS])
    else:
        op.create_index(TIMERS[0], "machines", TIMERS[1], sqlite_where=sa.text(TIMERS[2]))


def downgrade() -> None:
    op.drop_index(TIMERS[0], table_name="machines")
    drop_counts_table(op, "machine_counts", KEPT)
