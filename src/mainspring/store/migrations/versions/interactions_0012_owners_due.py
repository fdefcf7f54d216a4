"""interactions: each owner's next due time kept with the writes, so a fair lease reads only the owners it serves

A fair lease found every owner with an item due (one index probe each) and read all their rows: its cost grew
with the number of owners (x0.23 of a plain queue's throughput at 1,000 owners, issue 27). ``interaction_owners``
now holds, per owner of a queue with ``owner_by``, ``next_due``: never later than the earliest due time of the
owner's queued items (NULL: none queued). Triggers lower it in the transaction that queues an item (a create, a
retry, an expired lease, a wake, a new due time — whoever writes the row), and the lease raises it again, under
the owner's row lock, when it finds the owner has nothing more due. A partial index on ``(queue, turn, owner)``
over the owners with something queued gives the fair lease the owners in turn order, so it reads the few whose
turn is next.

The triggers' upsert locks the owner's row until the writer commits (also when the value does not change): a
lease that raises ``next_due`` waits for writers in flight for that owner, so it never raises it past an item
it could not see yet.

Cost on a big table: the triggers are created and the due times filled in one transaction that holds a SHARE
ROW EXCLUSIVE lock on ``interactions`` (writes wait, reads do not) for one pass over the queued items of the
queues with ``owner_by``; the index (on the small owners table) is built CONCURRENTLY on PostgreSQL.

Revision ID: interactions_0012
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import Millis

revision = "interactions_0012"
down_revision = "interactions_0011"
branch_labels = None
depends_on = None

OWNER_N_DISTINCT = -0.05
INDEX = ("ix_interaction_owners_turn", "(queue, turn, owner) WHERE next_due IS NOT NULL")

# Lowers the owners' next_due to the due time of what was queued, and locks their rows either way.
UPSERT = ("ON CONFLICT (queue, owner) DO UPDATE SET next_due = excluded.next_due "
          "WHERE interaction_owners.next_due IS NULL OR interaction_owners.next_due > excluded.next_due")
OWNED = "EXISTS (SELECT 1 FROM interaction_queues AS q WHERE q.name = {t}.queue AND q.owner_by IS NOT NULL)"
# An item becomes due to a lease: queued anew, or its due time changed. (A lease or a release never matches.)
QUEUED = "NEW.state = 'queued' AND NEW.next_processing IS NOT NULL"
REQUEUED = f"{QUEUED} AND (OLD.state <> 'queued' OR OLD.next_processing IS DISTINCT FROM NEW.next_processing OR OLD.owner <> NEW.owner)"

PG_FUNCTIONS = [
    "CREATE OR REPLACE FUNCTION mainspring_interactions_owner_due_inserted() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN INSERT INTO interaction_owners (queue, owner, next_due) "
    "SELECT c.queue, c.owner, min(c.next_processing) FROM changed AS c WHERE c.state = 'queued' AND c.next_processing IS NOT NULL "
    f"AND {OWNED.format(t='c')} GROUP BY 1, 2 ORDER BY 1, 2 {UPSERT}; RETURN NULL; END $$",
    "CREATE OR REPLACE FUNCTION mainspring_interactions_owner_due_moved() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN INSERT INTO interaction_owners (queue, owner, next_due) "
    f"SELECT NEW.queue, NEW.owner, NEW.next_processing WHERE {OWNED.format(t='NEW')} {UPSERT}; RETURN NULL; END $$",
]

PG_TRIGGERS = [
    "CREATE TRIGGER interactions_owner_due_insert AFTER INSERT ON interactions REFERENCING NEW TABLE AS changed "
    "FOR EACH STATEMENT EXECUTE FUNCTION mainspring_interactions_owner_due_inserted()",
    # Row by row, but the WHEN is checked in C: leases and releases never reach the function.
    "CREATE TRIGGER interactions_owner_due_update AFTER UPDATE OF state, next_processing, owner ON interactions "
    f"FOR EACH ROW WHEN ({REQUEUED}) EXECUTE FUNCTION mainspring_interactions_owner_due_moved()",
]

_SQLITE_UPSERT = ("INSERT INTO interaction_owners (queue, owner, next_due) VALUES (NEW.queue, NEW.owner, NEW.next_processing) "
                  + UPSERT + ";")
SQLITE_TRIGGERS = [
    f"CREATE TRIGGER interactions_owner_due_insert AFTER INSERT ON interactions WHEN {QUEUED} AND {OWNED.format(t='NEW')} "
    f"BEGIN {_SQLITE_UPSERT} END",
    f"CREATE TRIGGER interactions_owner_due_update AFTER UPDATE OF state, next_processing, owner ON interactions "
    f"WHEN {REQUEUED} AND {OWNED.format(t='NEW')} BEGIN {_SQLITE_UPSERT} END",
]

# The owners' due times as the items are now (also what a change of ``owner_by`` runs for its queue).
FILL = ("INSERT INTO interaction_owners (queue, owner, next_due) SELECT i.queue, i.owner, min(i.next_processing) "
        "FROM interactions AS i WHERE i.queue = :queue AND i.state = 'queued' AND i.next_processing IS NOT NULL "
        "GROUP BY i.queue, i.owner ORDER BY i.owner " + UPSERT)


def upgrade() -> None:
    bind = op.get_bind()
    postgres = bind.dialect.name == "postgresql"
    # On PostgreSQL the index is built after a commit (CONCURRENTLY cannot run in a transaction): a run stopped
    # during the build leaves this revision unrecorded with the column and triggers in place; the next skips them.
    if "next_due" not in {c["name"] for c in sa.inspect(bind).get_columns("interaction_owners")}:
        _due_times(postgres)
    if not postgres:
        op.execute(f"CREATE INDEX IF NOT EXISTS {INDEX[0]} ON interaction_owners {INDEX[1]}")
        return
    bind.commit()
    auto = bind.execution_options(isolation_level="AUTOCOMMIT")
    # The planner's guess for "owner = x" with x unknown when it plans (the fair lease reads each owner's head in one
    # statement, a lateral over the owners) is 1 / the distinct owners it sampled: with one flooding owner in the
    # sample, "all of the queue", and it read a small owner's head through the whole queue's priority index, past
    # the flood's items (25 ms a lease at 200,000 due). Owners are many by nature: 5 % of the rows distinct.
    auto.exec_driver_sql(f"ALTER TABLE interactions ALTER COLUMN owner SET (n_distinct = {OWNER_N_DISTINCT})")
    auto.exec_driver_sql("ANALYZE interactions (owner)")  # a sample of the table (30,000 rows), not a scan
    name, shape = INDEX
    invalid = auto.exec_driver_sql(f"SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('{name}') AND NOT indisvalid").first()
    if invalid:
        auto.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    auto.exec_driver_sql(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON interaction_owners {shape}")
    auto.commit()  # SQLAlchemy's own transaction object (the driver commits each statement by itself)
    bind.execution_options(isolation_level="READ COMMITTED")


def _due_times(postgres: bool) -> None:
    op.add_column("interaction_owners", sa.Column("next_due", Millis, nullable=True))
    if postgres:
        # Taken first, so no write slips between the triggers' creation and the fill (writes wait).
        op.execute("LOCK TABLE interactions IN SHARE ROW EXCLUSIVE MODE")
        for statement in [*PG_FUNCTIONS, *PG_TRIGGERS]:
            op.execute(statement)
    else:
        for statement in SQLITE_TRIGGERS:
            op.execute(statement)
    bind = op.get_bind()
    for (queue,) in bind.execute(sa.text("SELECT name FROM interaction_queues WHERE owner_by IS NOT NULL ORDER BY name")).all():
        bind.execute(sa.text(FILL), {"queue": queue})


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.execute(f"DROP INDEX IF EXISTS {INDEX[0]}")
    if postgres:
        op.execute("ALTER TABLE interactions ALTER COLUMN owner RESET (n_distinct)")
    for event in ("insert", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS interactions_owner_due_{event}" + (" ON interactions" if postgres else ""))
    if postgres:
        for kind in ("inserted", "moved"):
            op.execute(f"DROP FUNCTION IF EXISTS mainspring_interactions_owner_due_{kind}()")
    with op.batch_alter_table("interaction_owners") as batch:
        batch.drop_column("next_due")
