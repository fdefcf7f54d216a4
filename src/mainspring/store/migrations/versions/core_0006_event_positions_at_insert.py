"""core: PostgreSQL numbers each event as it is inserted, in commit order, instead of a sequencer rewriting it

Until now events were inserted without a position and a sequencer numbered the committed ones with a second
write of every event row (an UPDATE of an indexed column: a new row version and new index entries), at the
cost of a round of its own per commit on some server. Now the column's default numbers the row as it is
written: it takes one transaction-level advisory lock, then the next value of a sequence. The lock is held
until the transaction ends, and PostgreSQL releases a transaction's locks only after its commit is visible,
so a transaction that numbers after another has committed (or rolled back) numbers above it: positions
grow in commit order, and a reader following them never passes a position that commits later. A rolled
back transaction leaves a gap, which readers step over (they never wait for a number).

The server writes every transaction's events in one statement just before its COMMIT (``core.outbox``), so
the lock is held for that last moment only; any INSERT that names no position — a face's statement, a
script's, an older server's during a rolling upgrade — is numbered the same way.

The sequence must keep ``CACHE 1`` (its default): with a larger cache each session hands out numbers from
its own block, out of commit order.

Revision ID: core_0006
"""

from alembic import op

from mainspring.store.postgres import lock_key

revision = "core_0006"
down_revision = "core_0004"
branch_labels = None
depends_on = None

NUMBERING_LOCK = "mainspring:events-numbering"
"""The advisory lock every insert of an event takes before its number (``core.outbox.NUMBERING_LOCK``)."""

# void::text is '', so the lock is taken first, then the number (expression arguments are evaluated in order).
DEFAULT = f"CASE WHEN pg_advisory_xact_lock({lock_key(NUMBERING_LOCK)})::text = '' THEN nextval('events_position_seq') END"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite has one writer: its insert takes max(position) + 1 itself
    # No event is inserted or numbered while the last unnumbered ones get their positions (an older
    # server's sequencer may still run: it then finds nothing to number).
    op.execute("LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE")
    op.execute(
        "UPDATE events SET position = numbered.pos FROM (SELECT id, "
        "(SELECT COALESCE(MAX(position), 0) FROM events) + row_number() OVER (ORDER BY id) AS pos "
        "FROM events WHERE position IS NULL) AS numbered WHERE events.id = numbered.id"
    )
    op.execute("CREATE SEQUENCE events_position_seq AS bigint CACHE 1 OWNED BY events.position")
    op.execute("SELECT setval('events_position_seq', COALESCE((SELECT MAX(position) FROM events), 0) + 1, false)")
    op.execute(f"ALTER TABLE events ALTER COLUMN position SET DEFAULT {DEFAULT}")
    # Only the sequencer's search for unnumbered events used it.
    op.execute("DROP INDEX IF EXISTS ix_events_unpositioned")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("CREATE INDEX IF NOT EXISTS ix_events_unpositioned ON events (id) WHERE position IS NULL")
    op.execute("ALTER TABLE events ALTER COLUMN position DROP DEFAULT")
    op.execute("DROP SEQUENCE IF EXISTS events_position_seq")
