"""batching: tasks and packages by batcher and status kept with the writes

Counting them read every row of both tables on the overview, /metrics and a batcher's page (issue 26).
``batching_counts`` is kept by triggers (``store.counts``, the mechanism of interactions_0011); retention's
deletes count down too. Cost on a big table: one transaction holding a SHARE ROW EXCLUSIVE lock on each table
(writes wait, reads do not) for one scan of it (docs/operations.md has the measured time).

Revision ID: batching_0004
"""

from alembic import op

from mainspring.store.counts import KeptCount, create_counts_table, drop_counts_table

revision = "batching_0004"
down_revision = "batching_0003"
branch_labels = None
depends_on = None

# Tasks and packages change status many in one statement (a claim of several packages, their tasks).
KEPT = [KeptCount("batching_counts", "batch_tasks", "tasks", status="status", group="batcher", per_statement=True),
        KeptCount("batching_counts", "batch_packages", "packages", status="status", group="batcher", per_statement=True)]


def upgrade() -> None:
    create_counts_table(op, "batching_counts", KEPT)


def downgrade() -> None:
    drop_counts_table(op, "batching_counts", KEPT)
