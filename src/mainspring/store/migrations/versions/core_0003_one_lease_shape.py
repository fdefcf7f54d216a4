"""core: publisher cursors take the one lease shape (lease_token 64, lease_expires_at)

Revision ID: core_0003
"""

import sqlalchemy as sa
from alembic import op

revision = "core_0003"
down_revision = "core_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("publisher_cursors") as batch:
        batch.alter_column("lease_until", new_column_name="lease_expires_at")
        batch.alter_column("lease_token", type_=sa.String(64), existing_type=sa.String(40), existing_nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("publisher_cursors") as batch:
        batch.alter_column("lease_expires_at", new_column_name="lease_until")
        batch.alter_column("lease_token", type_=sa.String(40), existing_type=sa.String(64), existing_nullable=True)
