"""interactions: on PostgreSQL, the counts follow updates once per statement rather than once per row

The update trigger of ``interactions_0011`` ran its plpgsql upsert for every row whose status changed: a lease
of 500 items and their completion ran it 1,000 times, each an ``INSERT … ON CONFLICT`` on the backend's count
rows (issue 24). The trigger here runs once per UPDATE statement, with the statement's old and new rows as
transition tables, and writes one upsert for the (queue, status) pairs whose count moved — still in the same
transaction as the rows, whoever writes them, so the counts stay exact.

PostgreSQL does not allow transition tables on a trigger with a column list (``UPDATE OF``), so it fires on
every UPDATE of ``interactions``; a statement that moves no status (a batch of lease extensions: one statement
on PostgreSQL, ``data.extend_leases``) finds no pair and writes nothing. SQLite keeps its row triggers (there is
no statement trigger there).

Revision ID: interactions_0013
"""

from alembic import op

revision = "interactions_0013"
down_revision = "interactions_0012"
branch_labels = None
depends_on = None

KEY = "CASE WHEN {t}.state = 'queued' AND {t}.next_processing IS NULL THEN 'waiting' ELSE {t}.state END"

MOVED_PER_STATEMENT = (
    "CREATE OR REPLACE FUNCTION mainspring_interactions_count_moved_rows() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN INSERT INTO interaction_counts AS c (queue, status, slot, n) "
    "SELECT queue, status, pg_backend_pid(), sum(n) FROM ("
    f"SELECT gone.queue, {KEY.format(t='gone')}, -1 FROM gone UNION ALL "
    f"SELECT changed.queue, {KEY.format(t='changed')}, 1 FROM changed) AS r(queue, status, n) "
    "GROUP BY queue, status HAVING sum(n) <> 0 "
    "ON CONFLICT (queue, status, slot) DO UPDATE SET n = c.n + excluded.n; RETURN NULL; END $$"
)

# interactions_0011's row trigger, for the downgrade (its function stays in place until 0011 is downgraded).
ROW_KEY_MOVED = f"OLD.queue IS DISTINCT FROM NEW.queue OR ({KEY.format(t='OLD')}) IS DISTINCT FROM ({KEY.format(t='NEW')})"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(MOVED_PER_STATEMENT)
    op.execute("DROP TRIGGER IF EXISTS interactions_count_update ON interactions")
    op.execute("CREATE TRIGGER interactions_count_update AFTER UPDATE ON interactions "
               "REFERENCING OLD TABLE AS gone NEW TABLE AS changed "
               "FOR EACH STATEMENT EXECUTE FUNCTION mainspring_interactions_count_moved_rows()")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS interactions_count_update ON interactions")
    op.execute("CREATE TRIGGER interactions_count_update AFTER UPDATE OF queue, state, next_processing ON interactions "
               f"FOR EACH ROW WHEN ({ROW_KEY_MOVED}) EXECUTE FUNCTION mainspring_interactions_count_moved()")
    op.execute("DROP FUNCTION IF EXISTS mainspring_interactions_count_moved_rows()")
