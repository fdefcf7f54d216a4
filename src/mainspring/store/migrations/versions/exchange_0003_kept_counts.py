"""exchange: processes and messages by state kept with the writes

Counting them by state read every row of both tables on the overview (issue 26). ``exchange_counts`` is kept
by triggers (``store.counts``, the mechanism of interactions_0011); retention's deletes count down too. Cost
on a big table: one transaction holding a SHARE ROW EXCLUSIVE lock on each table (writes wait, reads do not)
for one scan of it (docs/operations.md has the measured time).

Revision ID: exchange_0003
"""

from alembic import op

from mainspring.store.counts import KeptCount, create_counts_table, drop_counts_table

revision = "exchange_0003"
down_revision = "exchange_0002"
branch_labels = None
depends_on = None

KEPT = [KeptCount("exchange_counts", "exchange_processes", "processes", status="state"),
        KeptCount("exchange_counts", "exchange_messages", "messages", status="state")]


def upgrade() -> None:
    create_counts_table(op, "exchange_counts", KEPT)


def downgrade() -> None:
    drop_counts_table(op, "exchange_counts", KEPT)
