"""machines: namespaces, machines, history, notifications, idempotent operations, failure journal

Revision ID: machines_0001
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import BigId, Json, Millis

revision = "machines_0001"
down_revision = None
branch_labels = ("machines",)
depends_on = "core_0001"


def upgrade() -> None:
    op.create_table(
        "machine_namespaces",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("processor_url", sa.String(2000), nullable=True),
        sa.Column("timeout_ms", sa.Integer, nullable=False),
        sa.Column("retry", Json, nullable=False),
        sa.Column("history", Json, nullable=False),
        sa.Column("updated_at", Millis, nullable=False),
    )
    op.create_table(
        "machines",
        sa.Column("uid", BigId, primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("last_event_id", sa.Integer, nullable=False),
        sa.Column("aux_state", Json, nullable=True),
        sa.Column("timer_at", Millis, nullable=True),
        sa.Column("notify_at", Millis, nullable=True),
        sa.Column("wake_at", Millis, nullable=True),
        sa.Column("retry_attempt", sa.Integer, nullable=False),
        sa.Column("retry_since", Millis, nullable=True),
        sa.Column("lease_token", sa.String(40), nullable=True),
        sa.Column("lease_until", Millis, nullable=True),
        sa.Column("error", Json, nullable=True),
        sa.Column("created_at", Millis, nullable=False),
        sa.Column("updated_at", Millis, nullable=False),
        sa.UniqueConstraint("namespace", "id", name="uq_machines_namespace_id"),
    )
    op.create_index("ix_machines_wake", "machines", ["status", "wake_at"])
    op.create_index("ix_machines_ns_status", "machines", ["namespace", "status", "id"])
    op.create_table(
        "machine_history",
        sa.Column("machine_uid", BigId, sa.ForeignKey("machines.uid", ondelete="CASCADE"), primary_key=True),
        sa.Column("event_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("created_at", Millis, nullable=False),
        sa.Column("data", Json, nullable=True),
    )
    op.create_table(
        "machine_notifications",
        sa.Column("seq", BigId, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(40), nullable=False, unique=True),
        sa.Column("machine_uid", BigId, sa.ForeignKey("machines.uid", ondelete="CASCADE"), nullable=False),
        sa.Column("args", Json, nullable=True),
        sa.Column("created_at", Millis, nullable=False),
        sa.Column("due_at", Millis, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("first_failed_at", Millis, nullable=True),
    )
    op.create_index("ix_machine_notifications_machine", "machine_notifications", ["machine_uid", "seq"])
    op.create_table(
        "machine_operations",
        sa.Column("namespace", sa.String(128), primary_key=True),
        sa.Column("machine_id", sa.String(128), primary_key=True),
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status_code", sa.Integer, nullable=False),
        sa.Column("body", Json, nullable=True),
        sa.Column("created_at", Millis, nullable=False),
    )
    op.create_table(
        "machine_failures",
        sa.Column("seq", BigId, primary_key=True, autoincrement=True),
        sa.Column("machine_uid", BigId, sa.ForeignKey("machines.uid", ondelete="CASCADE"), nullable=False),
        sa.Column("at", Millis, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("code", sa.String(40), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("permanent", sa.Boolean, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
    )
    op.create_index("ix_machine_failures_machine", "machine_failures", ["machine_uid", "seq"])


def downgrade() -> None:
    for table in ("machine_failures", "machine_operations", "machine_notifications", "machine_history", "machines", "machine_namespaces"):
        op.drop_table(table)
