"""core: the outbox, alerts and API tokens

Revision ID: core_0001
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import BigId, Json, Millis

revision = "core_0001"
down_revision = None
branch_labels = ("core",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("position", sa.BigInteger, nullable=True),
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("at", Millis, nullable=False),
        sa.Column("subject_kind", sa.String(50), nullable=False),
        sa.Column("subject_id", sa.String(400), nullable=False),
        sa.Column("data", Json, nullable=False),
    )
    op.create_index("ix_events_position", "events", ["position"], unique=True)
    op.create_index(
        "ix_events_unpositioned",
        "events",
        ["id"],
        postgresql_where=sa.text("position IS NULL"),
        sqlite_where=sa.text("position IS NULL"),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("at", Millis, nullable=False),
        sa.Column("severity", sa.String(20), nullable=False),
        sa.Column("code", sa.String(100), nullable=False),
        sa.Column("subject_kind", sa.String(50), nullable=False),
        sa.Column("subject_id", sa.String(400), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("acked_at", Millis, nullable=True),
    )
    op.create_index("ix_alerts_open", "alerts", ["acked_at", "at"])
    op.create_index("ix_alerts_subject", "alerts", ["code", "subject_kind", "subject_id"])
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("scopes", Json, nullable=False),
        sa.Column("created_at", Millis, nullable=False),
        sa.Column("revoked_at", Millis, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("api_tokens")
    op.drop_table("alerts")
    op.drop_table("events")
