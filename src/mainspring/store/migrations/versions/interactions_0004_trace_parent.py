"""interactions: the W3C traceparent of the request that created the item, so its handler runs in a span
linked to it (when tracing is on)

Revision ID: interactions_0004
"""

import sqlalchemy as sa
from alembic import op

revision = "interactions_0004"
down_revision = "interactions_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("interactions", sa.Column("trace_parent", sa.String(55), nullable=True))


def downgrade() -> None:
    op.drop_column("interactions", "trace_parent")
