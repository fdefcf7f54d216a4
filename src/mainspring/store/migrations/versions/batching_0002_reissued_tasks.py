"""batching: tasks made by the dispatcher to complete a group (API.md §4, "one member changed alone") are
marked ``reissued``

Revision ID: batching_0002
"""

import sqlalchemy as sa
from alembic import op

revision = "batching_0002"
down_revision = "batching_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batch_tasks", sa.Column("reissued", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("batch_tasks") as batch:
        batch.drop_column("reissued")
