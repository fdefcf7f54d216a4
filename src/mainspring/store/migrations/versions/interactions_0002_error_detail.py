"""interactions: the exception a Python handler raised, kept with the item (type, message, traceback)

Revision ID: interactions_0002
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import Json

revision = "interactions_0002"
down_revision = "interactions_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("interactions", sa.Column("error_detail", Json, nullable=True))


def downgrade() -> None:
    op.drop_column("interactions", "error_detail")
