"""machines: the one lease shape (lease_token 64, lease_expires_at)

Revision ID: machines_0002
"""

import sqlalchemy as sa
from alembic import op

revision = "machines_0002"
down_revision = "machines_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # recreate="never": rebuilding `machines` on SQLite would drop the old table, and with foreign keys on
    # that drop cascades into its history, notifications and journal. SQLite renames a column in place and
    # does not enforce VARCHAR lengths, so only PostgreSQL widens the token.
    with op.batch_alter_table("machines", recreate="never") as batch:
        batch.alter_column("lease_until", new_column_name="lease_expires_at")
    if op.get_bind().dialect.name != "sqlite":
        with op.batch_alter_table("machines") as batch:
            batch.alter_column("lease_token", type_=sa.String(64), existing_type=sa.String(40), existing_nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("machines", recreate="never") as batch:
        batch.alter_column("lease_expires_at", new_column_name="lease_until")
    if op.get_bind().dialect.name != "sqlite":
        with op.batch_alter_table("machines") as batch:
            batch.alter_column("lease_token", type_=sa.String(40), existing_type=sa.String(64), existing_nullable=True)
