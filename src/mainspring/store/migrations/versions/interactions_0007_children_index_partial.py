"""interactions: the children index holds children only

Most items have no parent, yet every one had an entry in (parent_id, name, id), written again by each of its
lease and release updates (they are not HOT: they change indexed columns). Every query of that index asks for
given parents, so a partial index serves them all; PostgreSQL spent 12-15 % less CPU per processed item.

Revision ID: interactions_0007
"""

import sqlalchemy as sa
from alembic import op

revision = "interactions_0007"
down_revision = "interactions_0006"
branch_labels = None
depends_on = None

COLUMNS = ["parent_id", "name", "id"]


def upgrade() -> None:
    op.drop_index("ix_interactions_children", table_name="interactions")
    has_parent = sa.text("parent_id IS NOT NULL")
    op.create_index("ix_interactions_children", "interactions", COLUMNS, postgresql_where=has_parent, sqlite_where=has_parent)


def downgrade() -> None:
    op.drop_index("ix_interactions_children", table_name="interactions")
    op.create_index("ix_interactions_children", "interactions", COLUMNS)
