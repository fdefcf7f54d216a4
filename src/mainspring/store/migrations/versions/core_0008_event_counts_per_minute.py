"""core: events per minute by type kept with the writes, for the dashboard's throughput chart (issue 26)

The overview counted the last hour's events by type on every view: at 13M events that walked ~11M entries of
``ix_events_at`` (3.6 s over HTTP). ``event_counts`` is kept by a trigger on ``events`` inserts
(``store.counts``: statement by statement on PostgreSQL, per backend slot), one row per minute, type and
slot; the chart reads the last hour's rows. It counts events as they are written (throughput): retention's
deletes do not count down, events retention prunes the minutes it has passed instead.

Cost on a big table: one transaction holding a SHARE ROW EXCLUSIVE lock on ``events`` (writes wait, reads
do not) for one scan of it, to count the events already there (docs/operations.md).

Revision ID: core_0008
"""

from alembic import op

from mainspring.core.tables import EVENTS_PER_MINUTE
from mainspring.store.counts import create_counts_table, drop_counts_table

revision = "core_0008"
down_revision = "core_0007"
branch_labels = None
depends_on = None

KEPT = [EVENTS_PER_MINUTE]


def upgrade() -> None:
    create_counts_table(op, "event_counts", KEPT)


def downgrade() -> None:
    drop_counts_table(op, "event_counts", KEPT)
