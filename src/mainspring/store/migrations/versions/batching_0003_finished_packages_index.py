"""batching: an index to find finished packages by when they finished (the retention loop)

Revision ID: batching_0003
"""

from alembic import op

revision = "batching_0003"
down_revision = "batching_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_batch_packages_status_updated_at", "batch_packages", ["status", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_batch_packages_status_updated_at", table_name="batch_packages")
