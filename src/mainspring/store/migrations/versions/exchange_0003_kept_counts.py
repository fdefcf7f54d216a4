"""exchange: processes and messages by state kept with the writes; processes listed by start on an index

Counting them by state read every row of both tables on the overview (issue 26). ``exchange_counts`` is kept
by triggers (``store.counts``, the mechanism of interactions_0011); retention's deletes count down too.
Messages are counted per mailbox (addressee and database): ``/ui/exchange`` and ``/metrics`` read the
available messages of each mailbox from there rather than by a GROUP BY over the messages. Cost
on a big table: one transaction holding a SHARE ROW EXCLUSIVE lock on each table (writes wait, reads do not)
for one scan of it (docs/operations.md has the measured time).

The processes list (``GET /v1/exchange/processes?state=``, by start) sorted every process of the state for a
page (53 ms at 100,000 processes); two indexes in its order serve it with and without ``state``, built
CONCURRENTLY on PostgreSQL (writes go on).

Revision ID: exchange_0003
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.counts import KeptCount, create_counts_table, drop_counts_table
from mainspring.store.migrate import create_indexes_concurrently

revision = "exchange_0003"
down_revision = "exchange_0002"
branch_labels = None
depends_on = None

KEPT = [KeptCount("exchange_counts", "exchange_processes", "processes", status="state"),
        # A process's messages change state together, in one statement.
        KeptCount("exchange_counts", "exchange_messages", "messages", status="state", group=("addressee", "database"),
                  per_statement=True)]


INDEXES: list[tuple[str, list[str], str | None]] = [
    ("ix_exchange_processes_state_started", ["state", "started_at", "id"], None),
    ("ix_exchange_processes_started", ["started_at", "id"], None),
]


def upgrade() -> None:
    bind = op.get_bind()
    # A run stopped during the index builds has committed the counts: the next run builds the indexes only.
    if not sa.inspect(bind).has_table("exchange_counts"):
        create_counts_table(op, "exchange_counts", KEPT)
    if bind.dialect.name == "postgresql":
        create_indexes_concurrently(op, "exchange_processes", INDEXES)
    else:
        for name, columns, _where in INDEXES:
            op.create_index(name, "exchange_processes", columns)


def downgrade() -> None:
    for name, _columns, _where in INDEXES:
        op.drop_index(name, table_name="exchange_processes")
    drop_counts_table(op, "exchange_counts", KEPT)
