"""machines: counts by namespace and status kept with the writes

Counting machines by status read every row: a scan on the overview and every /metrics scrape, growing with
the table (issue 26). ``machine_counts`` is kept by triggers (``store.counts``, the mechanism of
interactions_0011). Cost on a big table: the triggers are created and the counts filled in one transaction
that holds a SHARE ROW EXCLUSIVE lock on ``machines`` (writes wait, reads do not) for one scan of the table
(docs/operations.md has the measured time).

Revision ID: machines_0006
"""

from alembic import op

from mainspring.store.counts import KeptCount, create_counts_table, drop_counts_table

revision = "machines_0006"
down_revision = "machines_0005"
branch_labels = None
depends_on = None

KEPT = [KeptCount("machine_counts", "machines", "machines", status="status", group="namespace")]


def upgrade() -> None:
    create_counts_table(op, "machine_counts", KEPT)


def downgrade() -> None:
    drop_counts_table(op, "machine_counts", KEPT)
