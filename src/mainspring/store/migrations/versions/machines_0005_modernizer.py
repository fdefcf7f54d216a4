"""machines: a namespace's Machinegun event Modernizer

Revision ID: machines_0005
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import Json

revision = "machines_0005"
down_revision = "machines_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column at the end: no rebuild on SQLite; a namespace written before has no Modernizer.
    with op.batch_alter_table("machine_namespaces", recreate="never") as batch:
        batch.add_column(sa.Column("modernizer", Json, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("machine_namespaces", recreate="never") as batch:
        batch.drop_column("modernizer")
