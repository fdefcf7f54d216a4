"""The exchange face's tables (migrations exchange_0001, exchange_0002).

Message bodies live in files; a message row is their index and records where its file must be
(``path``, NULL once deleted) and where it may still be (``prev_path``) until ``synced``. The store decides
first, the disk follows: every file move is re-runnable from these columns, so a crash between a move and
its commit is repaired by doing the same step again.
"""

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from mainspring.store.counts import counts_table
from mainspring.store.schema import Json, Millis, metadata

ACTIVE_STATES = ("STARTED", "READY_TO_COMMIT")
FINISHED_STATES = ("DONE", "ABORTED")
"""States a process never leaves; retention removes such processes (CANCELLED ones go at start-up)."""
_ACTIVE_WHERE = text("state IN ('STARTED', 'READY_TO_COMMIT')")

exchange_messages = Table(
    "exchange_messages",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("addressee", String(128), nullable=False),
    Column("database", String(128), nullable=False),
    Column("message_key", String(128), nullable=True),
    Column("size", BigInteger, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("content_type", String(255), nullable=False),
    Column("sender", String(400), nullable=True),
    Column("created_at", Millis, nullable=False),
    # PENDING (a reply not yet visible), AVAILABLE, TAKEN (by an active process), QUARANTINED (IN_DOUBT),
    # COMMITTED (file still to go), GONE (deleted or in backup/), DISCARDED (a reply of an aborted process).
    Column("state", String(20), nullable=False),
    Column("process_id", String(40), nullable=True),
    Column("origin_process_id", String(40), nullable=True),
    Column("path", String(600), nullable=True),
    Column("prev_path", String(600), nullable=True),
    Column("file_version", Integer, nullable=False, server_default="0"),
    Column("synced", Boolean, nullable=False, server_default=text("true")),
    Column("sync_attempts", Integer, nullable=False, server_default="0"),
    Column("next_sync_at", Millis, nullable=True),
    Column("sync_error", Text, nullable=True),
    UniqueConstraint("addressee", "database", "message_key", name="uq_exchange_messages_key"),
    Index("ix_exchange_messages_mailbox", "addressee", "database", "state", "created_at", "id"),
    Index("ix_exchange_messages_process", "process_id"),
    Index("ix_exchange_messages_origin", "origin_process_id"),
    Index("ix_exchange_messages_unsynced", "synced", "next_sync_at"),
)

exchange_processes = Table(
    "exchange_processes",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("addressee", String(128), nullable=False),
    Column("database", String(128), nullable=False),
    Column("client_id", String(128), nullable=False),
    Column("message_ids", Json, nullable=False),
    Column("state", String(20), nullable=False),
    Column("started_at", Millis, nullable=False),
    Column("deadline", Millis, nullable=True),
    Column("updated_at", Millis, nullable=False),
    Column("error", Text, nullable=True),
    Column("cleanup_attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", Millis, nullable=True),
    # One active (STARTED / READY_TO_COMMIT) process per mailbox, enforced by the store itself: under
    # any number of concurrent starts on any number of servers exactly one insert wins.
    Index(
        "uq_exchange_processes_active",
        "addressee",
        "database",
        unique=True,
        sqlite_where=_ACTIVE_WHERE,
        postgresql_where=_ACTIVE_WHERE,
    ),
    Index("ix_exchange_processes_state", "state", "deadline"),
    Index("ix_exchange_processes_mailbox", "addressee", "database", "state"),
    # Finished processes by when they finished (``updated_at`` never changes after DONE or ABORTED): retention.
    Index("ix_exchange_processes_finished", "state", "updated_at"),
    # The processes list, by start, with and without a state (exchange_0003).
    Index("ix_exchange_processes_state_started", "state", "started_at", "id"),
    Index("ix_exchange_processes_started", "started_at", "id"),
)

# Processes by state and messages by mailbox and state, kept by triggers in the transaction that changes them
# (migration exchange_0003, ``store.counts``): the overview's counts and the mailboxes' available messages
# (/ui/exchange, /metrics) without a scan of either table.
exchange_counts = counts_table("exchange_counts", metadata)
