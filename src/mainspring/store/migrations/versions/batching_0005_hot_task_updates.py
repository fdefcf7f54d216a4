"""batching: a task's claim and completion write no index entry (HOT updates on PostgreSQL)

A task row is updated twice after it is packed: ``claimed``, then ``done`` or ``failed`` with its result. Both
indexes that held ``status`` (``(status, batcher)`` and ``(batcher, status, seq)``) made each of those updates
write a new entry in all five indexes of ``batch_tasks`` (PostgreSQL updates a row in place, "HOT", only when
no indexed column changes). What those two indexes served is two small sets, which are told apart without
``status``:

- the tasks pending in a dispatcher (``pending_tasks``, ``batchers_with_pending_tasks``, the forming counts):
  the only tasks with neither a package nor a reason (packing sets ``package_id``; every rejection sets
  ``reason``) — ``ix_batch_tasks_pending`` holds them, by batcher in arrival order;
- the rejected tasks retention deletes: the only tasks with a ``reason`` — ``ix_batch_tasks_rejected``.

Every other read of tasks goes by ``seq``, ``(batcher, id)`` or a ``package_id`` (``ix_batch_tasks_packed`` now
leaves out the tasks without one), which no update changes after packing.

A HOT update also needs room on the row's own page. The page holds, besides its rows, their versions left by
the packing (a non-HOT update: the row moves from ``ix_batch_tasks_pending`` to ``ix_batch_tasks_packed``), and
a claim moves all the tasks of the packages it takes in one statement, consecutive rows, so the page must
take a new version of each of its rows at once (old ones are pruned only once no transaction can see them).
Measured with bench/batching.py (10,000 tasks of ~500 bytes, the claims' and completions' updates that were
HOT): fillfactor 70: 60 %; 50: 53–100 % (it depends on how the transactions overlap); 30: 100 % in every run
— ``fillfactor = 30``. The cost is disk: the heap of the tasks stored from now on takes ~3× the pages (tasks
whose content is large are TOASTed, and their rows stay small).

Cost on a big table: the new indexes are built CONCURRENTLY on PostgreSQL (writes go on), then the old ones
dropped CONCURRENTLY; ``SET (fillfactor)`` takes a SHARE UPDATE EXCLUSIVE lock for an instant and applies to
pages written from then on (no rewrite).

Revision ID: batching_0005
"""

import sqlalchemy as sa
from alembic import op

from mainspring.store.migrate import create_indexes_concurrently

revision = "batching_0005"
down_revision = "batching_0004"
branch_labels = None
depends_on = None

PENDING = "package_id IS NULL AND reason IS NULL"
REJECTED = "reason IS NOT NULL"
NEW_INDEXES: list[tuple[str, list[str], str | None]] = [
    ("ix_batch_tasks_pending", ["batcher", "seq"], PENDING),
    ("ix_batch_tasks_rejected", ["seq"], REJECTED),
    # A package's tasks, without the tasks that have none: the planners looked for the pending tasks (no
    # package) in the old ``ix_batch_tasks_package_id``, among the rejected ones.
    ("ix_batch_tasks_packed", ["package_id"], "package_id IS NOT NULL"),
]
OLD_INDEXES = ["ix_batch_tasks_status_batcher", "ix_batch_tasks_batcher_status_seq", "ix_batch_tasks_package_id"]
FILLFACTOR = 30


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        for name, columns, where in NEW_INDEXES:
            op.create_index(name, "batch_tasks", columns, sqlite_where=sa.text(where) if where else None)
        for name in OLD_INDEXES:
            op.drop_index(name, table_name="batch_tasks")
        return
    op.execute(f"ALTER TABLE batch_tasks SET (fillfactor = {FILLFACTOR})")
    create_indexes_concurrently(op, "batch_tasks", NEW_INDEXES)
    auto = bind.execution_options(isolation_level="AUTOCOMMIT")
    for name in OLD_INDEXES:
        auto.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        auto.commit()
    bind.execution_options(isolation_level="READ COMMITTED")


def downgrade() -> None:
    op.create_index("ix_batch_tasks_package_id", "batch_tasks", ["package_id"])
    op.create_index("ix_batch_tasks_status_batcher", "batch_tasks", ["status", "batcher"])
    op.create_index("ix_batch_tasks_batcher_status_seq", "batch_tasks", ["batcher", "status", "seq"])
    for name, _columns, _where in NEW_INDEXES:
        op.drop_index(name, table_name="batch_tasks")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE batch_tasks RESET (fillfactor)")
