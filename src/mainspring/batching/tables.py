"""The batching face's tables (migration batching_0001)."""

from sqlalchemy import Boolean, Column, Index, Integer, String, Table, Text, UniqueConstraint, false, text

from mainspring.core.leases import lease_columns
from mainspring.store.counts import counts_table
from mainspring.store.schema import BigId, Json, Millis, metadata

batchers = Table(
    "batchers",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("min_size", Integer, nullable=False),
    Column("max_size", Integer, nullable=False),
    Column("linger_ms", Millis, nullable=False),
    Column("max_wait_ms", Millis, nullable=False),
    Column("group_size", Integer, nullable=False),
    Column("incomplete_group", String(10), nullable=False),
    Column("lease_ms", Millis, nullable=False),
    # The batch being formed: when the pending count reached min_size, and when that timer ends.
    Column("linger_started_at", Millis, nullable=True),
    Column("linger_ends_at", Millis, nullable=True),
    Column("last_flush_at", Millis, nullable=True),
    # Tasks up to this seq were already kept once by a timer flush (carry): only a newer task restarts the timer.
    Column("carried_through_seq", BigId, nullable=False, server_default="0"),
    Column("created_at", Millis, nullable=False),
    Column("updated_at", Millis, nullable=False),
)

# The only tasks with neither a package (packing sets it) nor a reason (every rejection sets it) are pending;
# the only ones with a reason are rejected (batching_0005's partial indexes).
PENDING_TASK = "package_id IS NULL AND reason IS NULL"
REJECTED_TASK = "reason IS NOT NULL"
PACKED_TASK = "package_id IS NOT NULL"

batch_tasks = Table(
    "batch_tasks",
    metadata,
    Column("seq", BigId, primary_key=True, autoincrement=True),
    Column("batcher", String(128), nullable=False),
    Column("id", String(128), nullable=False),
    Column("group", String(128), nullable=False),
    Column("member", String(128), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("version", Integer, nullable=True),
    Column("status", String(20), nullable=False),
    Column("reason", String(40), nullable=True),
    Column("package_id", String(40), nullable=True),
    Column("content", Json, nullable=False),
    Column("data", Json, nullable=True),
    Column("result", Json, nullable=True),
    Column("error", Text, nullable=True),
    Column("created_at", Millis, nullable=False),
    Column("updated_at", Millis, nullable=False),
    # Made by the dispatcher to complete a group whose other members did not change (batching_0002).
    Column("reissued", Boolean, nullable=False, server_default=false()),
    UniqueConstraint("batcher", "id"),
    Index("ix_batch_tasks_packed", "package_id", postgresql_where=text(PACKED_TASK), sqlite_where=text(PACKED_TASK)),
    # No index holds ``status`` (batching_0005): a claim or a completion changes no indexed column, so
    # PostgreSQL updates the row in place (HOT). The pending and the rejected tasks are told apart without it.
    Index("ix_batch_tasks_pending", "batcher", "seq", postgresql_where=text(PENDING_TASK), sqlite_where=text(PENDING_TASK)),
    Index("ix_batch_tasks_rejected", "seq", postgresql_where=text(REJECTED_TASK), sqlite_where=text(REJECTED_TASK)),
    postgresql_with={"fillfactor": 30},  # room on each page for the new versions of its rows (batching_0005)
)

batch_versions = Table(
    "batch_versions",
    metadata,
    Column("seq", BigId, primary_key=True, autoincrement=True),
    Column("batcher", String(128), nullable=False),
    Column("group", String(128), nullable=False),
    Column("member", String(128), nullable=False),
    Column("version", Integer, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("task_id", String(128), nullable=False),
    Column("at", Millis, nullable=False),
    # Set when the task holding this version was rejected before it left the dispatcher: the number stays
    # taken (the log never loses a line) but the content no longer counts as loaded.
    Column("withdrawn_at", Millis, nullable=True),
    UniqueConstraint("batcher", "group", "member", "version"),
    Index("ix_batch_versions_batcher_group_version", "batcher", "group", "version"),
    Index("ix_batch_versions_batcher_group_member_sha256", "batcher", "group", "member", "sha256"),
)

batch_packages = Table(
    "batch_packages",
    metadata,
    Column("seq", BigId, primary_key=True, autoincrement=True),
    Column("id", String(40), nullable=False, unique=True),
    Column("batcher", String(128), nullable=False),
    Column("status", String(20), nullable=False),
    Column("size", Integer, nullable=False),
    Column("worker", String(400), nullable=True),
    *lease_columns(),
    Column("lease_ms", Millis, nullable=True),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("error", Text, nullable=True),
    Column("created_at", Millis, nullable=False),
    Column("updated_at", Millis, nullable=False),
    Index("ix_batch_packages_batcher_status_seq", "batcher", "status", "seq"),
    Index("ix_batch_packages_status_lease", "status", "lease_expires_at"),
    # Retention finds finished packages by when they finished (batching_0003).
    Index("ix_batch_packages_status_updated_at", "status", "updated_at"),
)

# Tasks and packages per batcher and status, kept by triggers in the transaction that changes them (migration
# batching_0004, ``store.counts``): the counts on the overview, /metrics and a batcher's page without a scan.
batching_counts = counts_table("batching_counts", metadata)
