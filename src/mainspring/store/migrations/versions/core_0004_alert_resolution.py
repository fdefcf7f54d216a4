"""core: an alert records when, by whom and why it was closed (the subject was fixed)

Revision ID: core_0004
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import Millis

revision = "core_0004"
down_revision = "core_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("resolved_at", Millis, nullable=True))
        batch.add_column(sa.Column("resolved_by", sa.String(200), nullable=True))
        batch.add_column(sa.Column("resolution", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_column("resolution")
        batch.drop_column("resolved_by")
        batch.drop_column("resolved_at")
