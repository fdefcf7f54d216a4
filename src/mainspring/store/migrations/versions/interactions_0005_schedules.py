"""interactions: cron-style schedules (periodic work), one interaction per tick

Revision ID: interactions_0005
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import Json, Millis

revision = "interactions_0005"
down_revision = "interactions_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "interaction_schedules",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("cron", sa.String(200), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("data", Json, nullable=True),
        sa.Column("catch_up_ms", Millis, nullable=False),
        sa.Column("next_tick", Millis, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("created_at", Millis, nullable=False),
        sa.Column("updated_at", Millis, nullable=False),
    )
    op.create_index("ix_interaction_schedules_next_tick", "interaction_schedules", ["next_tick"])


def downgrade() -> None:
    op.drop_table("interaction_schedules")
