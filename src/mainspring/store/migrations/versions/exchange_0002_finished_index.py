"""exchange: an index to find finished (DONE, ABORTED) processes by when they finished, for their retention

Revision ID: exchange_0002
"""

from alembic import op

revision = "exchange_0002"
down_revision = "exchange_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_exchange_processes_finished", "exchange_processes", ["state", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_exchange_processes_finished", "exchange_processes")
