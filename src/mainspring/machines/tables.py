"""The machines face's tables (migrations machines_0001, machines_0002: the one lease shape, machines_0003:
Machinegun's protocol, machines_0004: ids of up to 1 KiB,
machines_0005: a namespace's Modernizer)."""

from sqlalchemy import (
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from mainspring.core.leases import lease_columns
from mainspring.store.counts import counts_table
from mainspring.store.schema import BigId, Json, Millis, metadata

namespaces = Table(
    "machine_namespaces",
    metadata,
    Column("name", String(1024), primary_key=True),
    Column("processor_url", String(2000), nullable=True),
    Column("timeout_ms", Integer, nullable=False),
    Column("retry", Json, nullable=False),
    Column("history", Json, nullable=False),
    Column("updated_at", Millis, nullable=False),
    Column("processor_protocol", String(16), nullable=True),
    Column("retries", Json, nullable=True),
    Column("modernizer", Json, nullable=True),
)

machines = Table(
    "machines",
    metadata,
    Column("uid", BigId, primary_key=True, autoincrement=True),
    Column("namespace", String(1024), nullable=False),
    Column("id", String(1024), nullable=False),
    Column("status", String(16), nullable=False),
    Column("version", Integer, nullable=False),
    Column("last_event_id", Integer, nullable=False),
    Column("aux_state", Json, nullable=True),
    Column("timer_at", Millis, nullable=True),
    Column("notify_at", Millis, nullable=True),
    Column("wake_at", Millis, nullable=True),
    Column("retry_attempt", Integer, nullable=False),
    Column("retry_since", Millis, nullable=True),
    *lease_columns(),
    Column("error", Json, nullable=True),
    Column("created_at", Millis, nullable=False),
    Column("updated_at", Millis, nullable=False),
    Column("timer_range", Json, nullable=True),
    Column("timer_timeout_ms", Integer, nullable=True),
    UniqueConstraint("namespace", "id"),
    Index("ix_machines_wake", "status", "wake_at"),
    Index("ix_machines_ns_status", "namespace", "status", "id"),
    # Due timers of working machines, by due time (machines_0006): /metrics' backlog per namespace.
    Index("ix_machines_timers", "timer_at", "namespace", postgresql_where=text("status = 'working' AND timer_at IS NOT NULL"),
          sqlite_where=text("status = 'working' AND timer_at IS NOT NULL")),
)

history = Table(
    "machine_history",
    metadata,
    Column("machine_uid", BigId, ForeignKey("machines.uid", ondelete="CASCADE"), primary_key=True),
    Column("event_id", Integer, primary_key=True, autoincrement=False),
    Column("created_at", Millis, nullable=False),
    Column("data", Json, nullable=True),
)

notifications = Table(
    "machine_notifications",
    metadata,
    Column("seq", BigId, primary_key=True, autoincrement=True),
    Column("id", String(40), nullable=False, unique=True),
    Column("machine_uid", BigId, ForeignKey("machines.uid", ondelete="CASCADE"), nullable=False),
    Column("args", Json, nullable=True),
    Column("created_at", Millis, nullable=False),
    Column("due_at", Millis, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("first_failed_at", Millis, nullable=True),
    Column("history_range", Json, nullable=True),
    Index("ix_machine_notifications_machine", "machine_uid", "seq"),
)

operations = Table(
    "machine_operations",
    metadata,
    Column("namespace", String(1024), primary_key=True),
    Column("machine_id", String(1024), primary_key=True),
    Column("key", String(200), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("status_code", Integer, nullable=False),
    Column("body", Json, nullable=True),
    Column("created_at", Millis, nullable=False),
)

failures = Table(
    "machine_failures",
    metadata,
    Column("seq", BigId, primary_key=True, autoincrement=True),
    Column("machine_uid", BigId, ForeignKey("machines.uid", ondelete="CASCADE"), nullable=False),
    Column("at", Millis, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("code", String(40), nullable=False),
    Column("detail", Text, nullable=False),
    Column("permanent", Boolean, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("outcome", String(16), nullable=False),
    Index("ix_machine_failures_machine", "machine_uid", "seq"),
)

# Machines per namespace and status, kept by triggers in the transaction that changes them (migration
# machines_0006, ``store.counts``): the counts on the overview and /metrics without a scan of the machines.
machine_counts = counts_table("machine_counts", metadata)
