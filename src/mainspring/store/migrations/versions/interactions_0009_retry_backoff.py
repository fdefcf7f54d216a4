"""interactions: retries that back off — a queue's ``backoff`` (fixed or exponential), ``max_delay_ms`` and
``jitter`` (API.md §3)

Existing queues keep what they did: a fixed delay of their ``error_delay_ms``, without jitter.

Revision ID: interactions_0009
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import Millis

revision = "interactions_0009"
# Issue 28's branch; issue 28's sibling (fair leases) adds interactions_0008 from 0007 at the same time: at
# their merge this revision follows interactions_0008 instead.
down_revision = "interactions_0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("interaction_queues") as batch:
        batch.add_column(sa.Column("backoff", sa.String(16), nullable=False, server_default="fixed"))
        batch.add_column(sa.Column("max_delay_ms", Millis, nullable=False, server_default=sa.text("3600000")))
        batch.add_column(sa.Column("jitter", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("interaction_queues") as batch:
        batch.drop_column("jitter")
        batch.drop_column("max_delay_ms")
        batch.drop_column("backoff")
