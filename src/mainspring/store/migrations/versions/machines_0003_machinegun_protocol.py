"""machines: what Machinegun's protocol needs - a namespace's processor protocol and per-kind retry
policies, a timer's own history range and timeout, a notification's history range

Revision ID: machines_0003
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import Json

revision = "machines_0003"
down_revision = "machines_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Only nullable columns added at the end: no table is rebuilt on SQLite (a rebuild of `machines` would
    # cascade into its history, see machines_0002), and rows written before mean "as before": the JSON
    # protocol, the namespace's one retry policy, its range and timeout.
    with op.batch_alter_table("machine_namespaces", recreate="never") as batch:
        batch.add_column(sa.Column("processor_protocol", sa.String(16), nullable=True))
        batch.add_column(sa.Column("retries", Json, nullable=True))
    with op.batch_alter_table("machines", recreate="never") as batch:
        batch.add_column(sa.Column("timer_range", Json, nullable=True))
        batch.add_column(sa.Column("timer_timeout_ms", sa.Integer, nullable=True))
    with op.batch_alter_table("machine_notifications", recreate="never") as batch:
        batch.add_column(sa.Column("history_range", Json, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("machine_notifications", recreate="never") as batch:
        batch.drop_column("history_range")
    with op.batch_alter_table("machines", recreate="never") as batch:
        batch.drop_column("timer_timeout_ms")
        batch.drop_column("timer_range")
    with op.batch_alter_table("machine_namespaces", recreate="never") as batch:
        batch.drop_column("retries")
        batch.drop_column("processor_protocol")
