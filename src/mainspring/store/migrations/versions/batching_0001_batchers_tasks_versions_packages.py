"""batching: batchers, tasks, the permanent version log, packages

Revision ID: batching_0001
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import BigId, Json, Millis

revision = "batching_0001"
down_revision = None
branch_labels = ("batching",)
depends_on = "core_0001"


def upgrade() -> None:
    op.create_table(
        "batchers",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("min_size", sa.Integer, nullable=False),
        sa.Column("max_size", sa.Integer, nullable=False),
        sa.Column("linger_ms", Millis, nullable=False),
        sa.Column("max_wait_ms", Millis, nullable=False),
        sa.Column("group_size", sa.Integer, nullable=False),
        sa.Column("incomplete_group", sa.String(10), nullable=False),
        sa.Column("lease_ms", Millis, nullable=False),
        sa.Column("linger_started_at", Millis, nullable=True),
        sa.Column("linger_ends_at", Millis, nullable=True),
        sa.Column("last_flush_at", Millis, nullable=True),
        sa.Column("carried_through_seq", BigId, nullable=False, server_default="0"),
        sa.Column("created_at", Millis, nullable=False),
        sa.Column("updated_at", Millis, nullable=False),
    )
    op.create_table(
        "batch_tasks",
        sa.Column("seq", BigId, primary_key=True, autoincrement=True),
        sa.Column("batcher", sa.String(128), nullable=False),
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("group", sa.String(128), nullable=False),
        sa.Column("member", sa.String(128), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer, nullable=True),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("reason", sa.String(40), nullable=True),
        sa.Column("package_id", sa.String(40), nullable=True),
        sa.Column("content", Json, nullable=False),
        sa.Column("data", Json, nullable=True),
        sa.Column("result", Json, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", Millis, nullable=False),
        sa.Column("updated_at", Millis, nullable=False),
        sa.UniqueConstraint("batcher", "id", name="uq_batch_tasks_batcher_id"),
    )
    op.create_index("ix_batch_tasks_status_batcher", "batch_tasks", ["status", "batcher"])
    op.create_index("ix_batch_tasks_batcher_status_seq", "batch_tasks", ["batcher", "status", "seq"])
    op.create_index("ix_batch_tasks_package_id", "batch_tasks", ["package_id"])
    op.create_table(
        "batch_versions",
        sa.Column("seq", BigId, primary_key=True, autoincrement=True),
        sa.Column("batcher", sa.String(128), nullable=False),
        sa.Column("group", sa.String(128), nullable=False),
        sa.Column("member", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(128), nullable=False),
        sa.Column("at", Millis, nullable=False),
        sa.Column("withdrawn_at", Millis, nullable=True),
        sa.UniqueConstraint("batcher", "group", "member", "version", name="uq_batch_versions_batcher_group_member_version"),
    )
    op.create_index("ix_batch_versions_batcher_group_version", "batch_versions", ["batcher", "group", "version"])
    op.create_index(
        "ix_batch_versions_batcher_group_member_sha256", "batch_versions", ["batcher", "group", "member", "sha256"]
    )
    op.create_table(
        "batch_packages",
        sa.Column("seq", BigId, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("batcher", sa.String(128), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("worker", sa.String(400), nullable=True),
        sa.Column("lease_token", sa.String(64), nullable=True),
        sa.Column("lease_expires_at", Millis, nullable=True),
        sa.Column("lease_ms", Millis, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", Millis, nullable=False),
        sa.Column("updated_at", Millis, nullable=False),
        sa.UniqueConstraint("id", name="uq_batch_packages_id"),
    )
    op.create_index("ix_batch_packages_batcher_status_seq", "batch_packages", ["batcher", "status", "seq"])
    op.create_index("ix_batch_packages_status_lease", "batch_packages", ["status", "lease_expires_at"])


def downgrade() -> None:
    op.drop_table("batch_packages")
    op.drop_table("batch_versions")
    op.drop_table("batch_tasks")
    op.drop_table("batchers")
