"""interactions: queues (settings, rate window) and interactions

Revision ID: interactions_0001
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import BigId, Json, Millis

revision = "interactions_0001"
down_revision = None
branch_labels = ("interactions",)
depends_on = "core_0001"


def upgrade() -> None:
    op.create_table(
        "interaction_queues",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("rate_limit_count", sa.Integer, nullable=True),
        sa.Column("rate_limit_per_ms", Millis, nullable=True),
        sa.Column("concurrency", sa.Integer, nullable=True),
        sa.Column("lease_ms", Millis, nullable=False),
        sa.Column("error_delay_ms", Millis, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("processing_timeout_ms", Millis, nullable=True),
        sa.Column("retention_ms", Millis, nullable=True),
        sa.Column("window_start", Millis, nullable=False, server_default=sa.text("0")),
        sa.Column("window_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", Millis, nullable=False),
        sa.Column("updated_at", Millis, nullable=False),
    )
    op.create_table(
        "interactions",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("parent_id", BigId, nullable=True),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("message_id", sa.String(128), nullable=True),
        sa.Column("channel", sa.String(128), nullable=True),
        sa.Column("user", sa.String(128), nullable=True),
        sa.Column("source", sa.String(128), nullable=True),
        sa.Column("data", Json, nullable=True),
        sa.Column("result", Json, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("next_processing", Millis, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("lease_token", sa.String(64), nullable=True),
        sa.Column("lease_expires_at", Millis, nullable=True),
        sa.Column("leased_at", Millis, nullable=True),
        sa.Column("worker", sa.String(400), nullable=True),
        sa.Column("wake", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("created_at", Millis, nullable=False),
        sa.Column("updated_at", Millis, nullable=False),
        sa.Column("finished_at", Millis, nullable=True),
        sa.UniqueConstraint("queue", "message_id", name="uq_interactions_queue_message_id"),
    )
    queued = sa.text("state = 'queued'")
    op.create_index("ix_interactions_due", "interactions", ["queue", "next_processing", "id"], postgresql_where=queued, sqlite_where=queued)
    leased = sa.text("state = 'processing'")
    op.create_index("ix_interactions_leased", "interactions", ["queue", "lease_expires_at"], postgresql_where=leased, sqlite_where=leased)
    op.create_index("ix_interactions_children", "interactions", ["parent_id", "name", "id"])
    op.create_index("ix_interactions_queue_id", "interactions", ["queue", "id"])
    finished = sa.text("finished_at IS NOT NULL")
    op.create_index("ix_interactions_finished", "interactions", ["queue", "finished_at"], postgresql_where=finished, sqlite_where=finished)


def downgrade() -> None:
    op.drop_table("interactions")
    op.drop_table("interaction_queues")
