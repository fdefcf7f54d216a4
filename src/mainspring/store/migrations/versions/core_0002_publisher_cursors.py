"""core: durable cursors of the event publishers (NATS JetStream, Kafka, webhooks)

Revision ID: core_0002
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import Millis

revision = "core_0002"
down_revision = "core_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "publisher_cursors",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("lease_token", sa.String(40), nullable=True),
        sa.Column("lease_until", Millis, nullable=True),
        sa.Column("updated_at", Millis, nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("publisher_cursors")
