"""machines: namespaces and machine ids of up to 1 KiB, as Machinegun's clients use them

Revision ID: machines_0004
"""

import sqlalchemy as sa
from alembic import op

revision = "machines_0004"
down_revision = "machines_0003"
branch_labels = None
depends_on = None

COLUMNS = (("machine_namespaces", "name"), ("machines", "namespace"), ("machines", "id"),
           ("machine_operations", "namespace"), ("machine_operations", "machine_id"))


def upgrade() -> None:
    # SQLite does not enforce VARCHAR lengths (and rebuilding `machines` would cascade into its history, see
    # machines_0002). On PostgreSQL widening a varchar changes the catalog only: no table rewrite, no index
    # rebuild, so this is safe on a big table.
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=sa.String(1024), existing_type=sa.String(128), existing_nullable=False)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=sa.String(128), existing_type=sa.String(1024), existing_nullable=False)
