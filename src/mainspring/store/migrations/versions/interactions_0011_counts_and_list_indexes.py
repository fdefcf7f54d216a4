"""interactions: counts by status kept with the writes, and indexes that serve the status lists

Counting a queue's items by status read every row of the queue: 0.5 s at 1M items, growing with the table
(issue 26). ``interaction_counts`` holds, per queue and stored status, how many items there are; triggers
change it in the same transaction as the rows (whoever writes them: the server, a worker on the store, an
operator's SQL), so a count read from it is exact. The stored status is ``state``, except that a queued
item without a due time is ``waiting``; the API splits the other queued ones into ready and scheduled by
the clock when it reads.

On PostgreSQL each backend adds to rows of its own (``slot`` = its ``pg_backend_pid()``), so concurrent
transactions never wait for each other on a count row (and can never deadlock on them); the retention loop
folds the rows of backends that are gone into slot 0. SQLite has one writer: slot 0 only.

The status lists (``?status=failed``, ``ready``, ``waiting`` …) walked the queue's items by id filtering
the status: two partial indexes hold only the items such a list asks for, in id order. A lease writes one
more index entry for it (the item becomes ``processing``); a create one (it is ``queued``).

Cost on a big table: the triggers are created and the counts filled in one transaction that holds a SHARE
ROW EXCLUSIVE lock on ``interactions`` (writes wait, reads do not) for one scan of the table (docs/
operations.md has the measured time); the indexes are built CONCURRENTLY, without blocking writes.

Revision ID: interactions_0011
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.migrate import create_indexes_concurrently

revision = "interactions_0011"
down_revision = "interactions_0010"
branch_labels = None
depends_on = None

KEY = "CASE WHEN {t}.state = 'queued' AND {t}.next_processing IS NULL THEN 'waiting' ELSE {t}.state END"


def _pg_function(kind: str, rows: str) -> str:
    """A trigger function that adds ``rows`` (queue, status, n) to this backend's count rows."""
    return (
        f"CREATE OR REPLACE FUNCTION mainspring_interactions_count_{kind}() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN INSERT INTO interaction_counts AS c (queue, status, slot, n) "
        f"SELECT queue, status, pg_backend_pid(), n FROM ({rows}) AS r(queue, status, n) "
        "ON CONFLICT (queue, status, slot) DO UPDATE SET n = c.n + excluded.n; RETURN NULL; END $$"
    )


PG_FUNCTIONS = [
    _pg_function("inserted", f"SELECT queue, {KEY.format(t='changed')}, count(*) FROM changed GROUP BY 1, 2"),
    _pg_function("deleted", f"SELECT queue, {KEY.format(t='gone')}, -count(*) FROM gone GROUP BY 1, 2"),
    _pg_function("moved", f"VALUES (OLD.queue, {KEY.format(t='OLD')}, -1), (NEW.queue, {KEY.format(t='NEW')}, 1)"),
]

MOVED = f"OLD.queue IS DISTINCT FROM NEW.queue OR ({KEY.format(t='OLD')}) IS DISTINCT FROM ({KEY.format(t='NEW')})"

PG_TRIGGERS = [
    "CREATE TRIGGER interactions_count_insert AFTER INSERT ON interactions REFERENCING NEW TABLE AS changed "
    "FOR EACH STATEMENT EXECUTE FUNCTION mainspring_interactions_count_inserted()",
    "CREATE TRIGGER interactions_count_delete AFTER DELETE ON interactions REFERENCING OLD TABLE AS gone "
    "FOR EACH STATEMENT EXECUTE FUNCTION mainspring_interactions_count_deleted()",
    # Row by row, but only rows whose status changes reach the function: the WHEN is checked in C.
    "CREATE TRIGGER interactions_count_update AFTER UPDATE OF queue, state, next_processing ON interactions "
    f"FOR EACH ROW WHEN ({MOVED}) EXECUTE FUNCTION mainspring_interactions_count_moved()",
]

UPSERT_SQLITE = ("INSERT INTO interaction_counts (queue, status, slot, n) VALUES ({t}.queue, " + KEY + ", 0, {d}) "
                 "ON CONFLICT (queue, status, slot) DO UPDATE SET n = n + {d};")

SQLITE_TRIGGERS = [
    "CREATE TRIGGER interactions_count_insert AFTER INSERT ON interactions BEGIN "
    + UPSERT_SQLITE.format(t="NEW", d="1") + " END",
    "CREATE TRIGGER interactions_count_delete AFTER DELETE ON interactions BEGIN "
    + UPSERT_SQLITE.format(t="OLD", d="-1") + " END",
    f"CREATE TRIGGER interactions_count_update AFTER UPDATE OF queue, state, next_processing ON interactions "
    f"WHEN {MOVED} BEGIN " + UPSERT_SQLITE.format(t="OLD", d="-1") + " "
    + UPSERT_SQLITE.format(t="NEW", d="1") + " END",
]

INDEXES = [
    # ready / scheduled / waiting lists: queued items by id, with the due time to filter on in the index.
    ("ix_interactions_queued_by_id", ["queue", "id", "next_processing"], "state = 'queued'"),
    # processing / failed / cancelled lists: few items, which the queue's id index would have to look for among
    # millions (PostgreSQL's planner walks the primary key for ``processing``: 51,000 rows for a page at 1M).
    ("ix_interactions_few_by_id", ["queue", "state", "id"], "state IN ('processing', 'failed', 'cancelled')"),
]


def upgrade() -> None:
    bind = op.get_bind()
    postgres = bind.dialect.name == "postgresql"
    # On PostgreSQL the indexes are built after a commit (CONCURRENTLY cannot run in a transaction): a run
    # stopped during the build leaves this revision unrecorded with the counts already in place, so the
    # next run skips them and builds the indexes again.
    if not sa.inspect(bind).has_table("interaction_counts"):
        _counts(postgres)
    if not postgres:
        for name, columns, where in INDEXES:
            op.create_index(name, "interactions", columns, sqlite_where=sa.text(where))
        return
    create_indexes_concurrently(op, "interactions", INDEXES)


def _counts(postgres: bool) -> None:
    op.create_table(
        "interaction_counts",
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("slot", sa.Integer, nullable=False),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("queue", "status", "slot"),
    )
    if postgres:
        # Taken first, so no write slips between the triggers' creation and the fill (writes wait).
        op.execute("LOCK TABLE interactions IN SHARE ROW EXCLUSIVE MODE")
        for statement in [*PG_FUNCTIONS, *PG_TRIGGERS]:
            op.execute(statement)
        # Small and hot: vacuumed after a few hundred changes rather than PostgreSQL's 20 % of the table.
        op.execute("ALTER TABLE interaction_counts SET (autovacuum_vacuum_threshold = 200, "
                   "autovacuum_vacuum_scale_factor = 0, autovacuum_analyze_threshold = 200)")
    else:
        for statement in SQLITE_TRIGGERS:
            op.execute(statement)
    op.execute(f"INSERT INTO interaction_counts (queue, status, slot, n) "
               f"SELECT queue, {KEY.format(t='interactions')}, 0, count(*) FROM interactions GROUP BY 1, 2")


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for name, _columns, _where in INDEXES:
        op.drop_index(name, table_name="interactions")
    for event in ("insert", "delete", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS interactions_count_{event}" + (" ON interactions" if postgres else ""))
    if postgres:
        for kind in ("inserted", "deleted", "moved"):
            op.execute(f"DROP FUNCTION IF EXISTS mainspring_interactions_count_{kind}()")
    op.drop_table("interaction_counts")
