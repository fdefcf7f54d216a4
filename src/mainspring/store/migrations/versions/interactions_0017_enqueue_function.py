"""interactions: ``mainspring_enqueue(queue, data, fields)`` — any language creates an item in its own transaction

API.md §6: on PostgreSQL an application enqueues inside its own transaction, so the item exists if and only if
its own writes commit. The function (``interactions/enqueue.sql``, read here) does in SQL what a create does.

Its events — and those of the Python producer's ``create(…, connection=conn)`` — are not inserted into
``events`` directly: an insert there takes the events' numbering lock (core_0006) and holds it until the
transaction ends, and an application's transaction may stay open long after it enqueued, stopping every other
writer of events meanwhile. They are staged in ``events_at_commit`` instead, and a deferred constraint trigger
moves them into ``events`` when the transaction commits: the lock is then held for the commit only, as a server's
own transactions hold it. A rolled back transaction leaves nothing.

Revision ID: interactions_0017
"""

from pathlib import Path

from alembic import op

revision = "interactions_0017"
down_revision = "interactions_0015"
branch_labels = None
depends_on = "core_0006"

SQL = Path(__file__).resolve().parents[3] / "interactions" / "enqueue.sql"


def statements(script: str) -> list[str]:
    """The file's statements, one at a time (a prepared statement holds one): split at a ``;`` ending a line
    outside a ``$fn$`` body, comments dropped."""
    found: list[str] = []
    current: list[str] = []
    for line in script.splitlines():
        if not current and (not line.strip() or line.startswith("--")):
            continue
        current.append(line)
        if line.rstrip().endswith(";") and "\n".join(current).count("$fn$") % 2 == 0:
            found.append("\n".join(current).rstrip().removesuffix(";"))
            current = []
    return found


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite: the producer's own connection writes (one writer; nothing to defer)
    for statement in statements(SQL.read_text()):
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP FUNCTION IF EXISTS mainspring_enqueue(text, jsonb, jsonb)")
    op.execute("DROP TABLE IF EXISTS events_at_commit")
    op.execute("DROP FUNCTION IF EXISTS mainspring_events_at_commit()")
