"""exchange: messages (the index of the message files) and processes

Revision ID: exchange_0001
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import Json, Millis

revision = "exchange_0001"
down_revision = None
branch_labels = ("exchange",)
depends_on = "core_0001"

ACTIVE_WHERE = sa.text("state IN ('STARTED', 'READY_TO_COMMIT')")


def upgrade() -> None:
    op.create_table(
        "exchange_messages",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("addressee", sa.String(128), nullable=False),
        sa.Column("database", sa.String(128), nullable=False),
        sa.Column("message_key", sa.String(128), nullable=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("content_type", sa.String(255), nullable=False),
        sa.Column("sender", sa.String(400), nullable=True),
        sa.Column("created_at", Millis, nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("process_id", sa.String(40), nullable=True),
        sa.Column("origin_process_id", sa.String(40), nullable=True),
        sa.Column("path", sa.String(600), nullable=True),
        sa.Column("prev_path", sa.String(600), nullable=True),
        sa.Column("file_version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("synced", sa.Boolean, nullable=False, server_default=sa.text("true")),
        sa.Column("sync_attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_sync_at", Millis, nullable=True),
        sa.Column("sync_error", sa.Text, nullable=True),
        sa.UniqueConstraint("addressee", "database", "message_key", name="uq_exchange_messages_key"),
    )
    op.create_index(
        "ix_exchange_messages_mailbox", "exchange_messages", ["addressee", "database", "state", "created_at", "id"]
    )
    op.create_index("ix_exchange_messages_process", "exchange_messages", ["process_id"])
    op.create_index("ix_exchange_messages_origin", "exchange_messages", ["origin_process_id"])
    op.create_index("ix_exchange_messages_unsynced", "exchange_messages", ["synced", "next_sync_at"])
    op.create_table(
        "exchange_processes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("addressee", sa.String(128), nullable=False),
        sa.Column("database", sa.String(128), nullable=False),
        sa.Column("client_id", sa.String(128), nullable=False),
        sa.Column("message_ids", Json, nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("started_at", Millis, nullable=False),
        sa.Column("deadline", Millis, nullable=True),
        sa.Column("updated_at", Millis, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("cleanup_attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", Millis, nullable=True),
    )
    op.create_index(
        "uq_exchange_processes_active",
        "exchange_processes",
        ["addressee", "database"],
        unique=True,
        sqlite_where=ACTIVE_WHERE,
        postgresql_where=ACTIVE_WHERE,
    )
    op.create_index("ix_exchange_processes_state", "exchange_processes", ["state", "deadline"])
    op.create_index("ix_exchange_processes_mailbox", "exchange_processes", ["addressee", "database", "state"])


def downgrade() -> None:
    op.drop_table("exchange_processes")
    op.drop_table("exchange_messages")
