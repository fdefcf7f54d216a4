"""interactions: priorities that age, limits per owner, fair shares (issue 27, API.md §3)

Items get a ``priority`` and an ``owner`` (0 and '' for those queued before: their queues have no ``owner_by``);
queues get the settings, and each owner of a queue a row with its rate window and its turn. Two indexes
serve the lease's pick in its order: the queue's ready items by priority, and the same per owner.

On PostgreSQL the indexes are built CONCURRENTLY (outside the migration's transaction, so writes go on while
a big table is indexed). A build that died leaves an invalid index behind: it is dropped and built again when
the migration runs again. Items queued before the upgrade are in the new indexes like any other.

Revision ID: interactions_0010
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import Json, Millis

revision = "interactions_0010"
down_revision = "interactions_0009"
branch_labels = None
depends_on = None

READY = ("ix_interactions_ready", "(queue, priority DESC, next_processing, id) WHERE state = 'queued'")
OWNER_READY = ("ix_interactions_owner_ready", "(queue, owner, priority DESC, next_processing, id) WHERE state = 'queued'")


def upgrade() -> None:
    # On PostgreSQL the columns and the table commit before the indexes are built: a run that died building them
    # finds its columns there when it runs again (the revision is recorded only at the end).
    if not sa.inspect(op.get_bind()).has_table("interaction_owners"):
        _columns_and_owners()
    if op.get_bind().dialect.name != "postgresql":
        # SQLite builds an index inside the transaction: nothing is ever left half-built.
        for name, shape in (READY, OWNER_READY):
            op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON interactions {shape}")
        return
    # CONCURRENTLY cannot run in a transaction: what came before is committed (the columns above, and earlier
    # revisions), the builds run in autocommit, then the migration goes on in a transaction as before. (Alembic's
    # autocommit_block needs a transaction it began itself; mainspring.store.migrate hands it one already begun.)
    bind = op.get_bind()
    bind.commit()
    level = bind.get_isolation_level()
    bind.execution_options(isolation_level="AUTOCOMMIT")
    try:
        for name, shape in (READY, OWNER_READY):
            # An interrupted build leaves the index invalid (never read, yet written by every insert).
            invalid = bind.execute(sa.text("SELECT 1 FROM pg_index WHERE indexrelid = to_regclass(:name) AND NOT indisvalid"), {"name": name}).first()
            if invalid is not None:
                bind.execute(sa.text(f"DROP INDEX CONCURRENTLY IF EXISTS {name}"))
            bind.execute(sa.text(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON interactions {shape}"))
    finally:
        bind.commit()
        bind.execution_options(isolation_level=level)


def _columns_and_owners() -> None:
    with op.batch_alter_table("interaction_queues") as batch:
        batch.add_column(sa.Column("priority_aging_ms", Millis, nullable=True))
        batch.add_column(sa.Column("owner_by", sa.String(16), nullable=True))
        batch.add_column(sa.Column("per_owner_concurrency", sa.Integer, nullable=True))
        batch.add_column(sa.Column("per_owner_rate_count", sa.Integer, nullable=True))
        batch.add_column(sa.Column("per_owner_rate_per_ms", Millis, nullable=True))
        batch.add_column(sa.Column("fair", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("weights", Json, nullable=True))
        batch.add_column(sa.Column("fair_clock", sa.BigInteger, nullable=False, server_default=sa.text("0")))
    # Plain ADD COLUMN (not batch: SQLite would copy the whole table); a constant default is metadata only
    # on PostgreSQL, so a big table is not rewritten.
    op.add_column("interactions", sa.Column("priority", sa.Integer, nullable=False, server_default=sa.text("0")))
    op.add_column("interactions", sa.Column("owner", sa.String(128), nullable=False, server_default=""))
    op.create_table(
        "interaction_owners",
        sa.Column("queue", sa.String(128), primary_key=True),
        sa.Column("owner", sa.String(128), primary_key=True),
        sa.Column("window_start", Millis, nullable=False, server_default=sa.text("0")),
        sa.Column("window_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("turn", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.PrimaryKeyConstraint("queue", "owner", name="pk_interaction_owners"),
    )


def downgrade() -> None:
    for name, _ in (OWNER_READY, READY):
        op.execute(f"DROP INDEX IF EXISTS {name}")
    op.drop_table("interaction_owners")
    with op.batch_alter_table("interactions") as batch:
        batch.drop_column("owner")
        batch.drop_column("priority")
    with op.batch_alter_table("interaction_queues") as batch:
        for column in ("fair_clock", "weights", "fair", "per_owner_rate_per_ms", "per_owner_rate_count", "per_owner_concurrency",
                       "owner_by", "priority_aging_ms"):
            batch.drop_column(column)
