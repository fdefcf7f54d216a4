"""interactions: PostgreSQL wakes lease waiters itself when items become due, whoever changed them

A trigger NOTIFYs the queue's channel after any statement that inserts or updates items that are queued
with a due time, so rows changed by direct SQL (an operator's UPDATE, a script) wake workers at once
instead of at their poll interval. The server's own commits send the same NOTIFY; PostgreSQL delivers
identical ones of a transaction once.

Revision ID: interactions_0003
"""

from alembic import op

revision = "interactions_0003"
down_revision = "interactions_0002"
branch_labels = None
depends_on = None

FUNCTION = """
CREATE OR REPLACE FUNCTION mainspring_interactions_wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('mainspring', 'interactions:' || queue)
    FROM (SELECT DISTINCT queue FROM changed WHERE state = 'queued' AND next_processing IS NOT NULL) AS due;
    RETURN NULL;
END $$;
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(FUNCTION)
    # Transition tables cannot name columns, so the UPDATE trigger sees every update and filters the rows.
    for event in ("INSERT", "UPDATE"):
        op.execute(
            f"CREATE TRIGGER interactions_wake_after_{event.lower()} AFTER {event} ON interactions "
            "REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION mainspring_interactions_wake()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for event in ("insert", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS interactions_wake_after_{event} ON interactions")
    op.execute("DROP FUNCTION IF EXISTS mainspring_interactions_wake()")
