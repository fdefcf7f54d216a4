"""interactions: a queue can be paused (its row says so, so every server stops leasing from it at once)

Revision ID: interactions_0006
"""

import sqlalchemy as sa
from alembic import op

revision = "interactions_0006"
down_revision = "interactions_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("interaction_queues") as batch:
        batch.add_column(sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("interaction_queues") as batch:
        batch.drop_column("paused")
