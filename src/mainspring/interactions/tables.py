"""The interactions face's tables (migration interactions_0001)."""

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

from mainspring.core.leases import lease_columns
from mainspring.store.schema import BigId, Json, Millis, metadata

# One row per queue: its settings, read by every server at each lease, and its recent lease starts.
# Leasing locks this row, so the concurrency and rate limits hold across all servers.
interaction_queues = Table(
    "interaction_queues",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("rate_limit_count", Integer, nullable=True),
    Column("rate_limit_per_ms", Millis, nullable=True),
    Column("concurrency", Integer, nullable=True),
    Column("lease_ms", Millis, nullable=False),
    Column("error_delay_ms", Millis, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("processing_timeout_ms", Millis, nullable=True),
    Column("retention_ms", Millis, nullable=True),
    Column("created_at", Millis, nullable=False),
    Column("updated_at", Millis, nullable=False),
    # A paused queue leases nothing (migration interactions_0006); what is leased already runs on.
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    # How a failed attempt's retry is delayed (migration interactions_0009, API.md §3).
    Column("backoff", String(16), nullable=False, server_default="fixed"),
    Column("max_delay_ms", Millis, nullable=False, server_default=text("3600000")),
    Column("jitter", Boolean, nullable=False, server_default=text("false")),
    # Priorities that age, owners with their own limits, fair shares (migration interactions_0010, API.md §3).
    Column("priority_aging_ms", Millis, nullable=True),
    Column("owner_by", String(16), nullable=True),
    Column("per_owner_concurrency", Integer, nullable=True),
    Column("per_owner_rate_count", Integer, nullable=True),
    Column("per_owner_rate_per_ms", Millis, nullable=True),
    Column("fair", Boolean, nullable=False, server_default=text("false")),
    Column("weights", Json, nullable=True),
    # The fair scheduler's clock: where an owner that had nothing due starts again (the least ``turn``
    # of the owners served by the last lease), so coming back gives it its share, not a burst.
    Column("fair_clock", BigInteger, nullable=False, server_default=text("0")),
    # The rate limit's sliding window (migration interactions_0015): the lease starts of the last ``per_ms``,
    # ``[[at, n], …]`` oldest first (``leasing.rate_left``). The fixed window's ``window_start`` and
    # ``window_count`` stay in the table, unused, for servers of the previous release during a rolling upgrade.
    Column("rate_starts", Json, nullable=True),
)

# ``state`` is what is stored: queued | processing | completed | failed | cancelled. The API's status
# splits ``queued`` by ``next_processing``: scheduled (later), ready (now), waiting (none).
interactions = Table(
    "interactions",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("queue", String(128), nullable=False),
    Column("parent_id", BigId, nullable=True),
    Column("name", String(128), nullable=True),
    Column("message_id", String(128), nullable=True),
    Column("channel", String(128), nullable=True),
    Column("user", String(128), nullable=True),
    Column("source", String(128), nullable=True),
    Column("data", Json, nullable=True),
    Column("result", Json, nullable=True),
    Column("error", Text, nullable=True),
    Column("state", String(16), nullable=False),
    Column("next_processing", Millis, nullable=True),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    *lease_columns(),
    Column("leased_at", Millis, nullable=True),
    Column("worker", String(400), nullable=True),
    Column("wake", Boolean, nullable=False, server_default=text("false")),
    Column("created_at", Millis, nullable=False),
    Column("updated_at", Millis, nullable=False),
    Column("finished_at", Millis, nullable=True),
    Column("error_detail", Json, nullable=True),
    Column("trace_parent", String(55), nullable=True),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    # The value of the field the queue's ``owner_by`` names ('' for null, and for every item of a queue without
    # ``owner_by``): set when the item is created, and again for waiting items when ``owner_by`` changes.
    Column("owner", String(128), nullable=False, server_default=""),
    UniqueConstraint("queue", "message_id", name="uq_interactions_queue_message_id"),
    Index("ix_interactions_due", "queue", "next_processing", "id", postgresql_where=text("state = 'queued'"), sqlite_where=text("state = 'queued'")),
    # The lease's pick, in its order: highest priority, then earliest due, then id (migration interactions_0010).
    Index("ix_interactions_ready", "queue", text("priority DESC"), "next_processing", "id", postgresql_where=text("state = 'queued'"), sqlite_where=text("state = 'queued'")),
    # The same per owner, for queues with ``owner_by``. Both are partial on waiting items: a lease or a release
    # (which make an item processing or finished) writes neither.
    Index("ix_interactions_owner_ready", "queue", "owner", text("priority DESC"), "next_processing", "id",
          postgresql_where=text("state = 'queued'"), sqlite_where=text("state = 'queued'")),
    Index("ix_interactions_leased", "queue", "lease_expires_at", postgresql_where=text("state = 'processing'"), sqlite_where=text("state = 'processing'")),
    Index("ix_interactions_children", "parent_id", "name", "id", postgresql_where=text("parent_id IS NOT NULL"), sqlite_where=text("parent_id IS NOT NULL")),
    Index("ix_interactions_queue_id", "queue", "id"),
    Index("ix_interactions_finished", "queue", "finished_at", postgresql_where=text("finished_at IS NOT NULL"), sqlite_where=text("finished_at IS NOT NULL")),
    # The status lists by id (migration interactions_0011): queued items (ready, scheduled, waiting); processing, failed and cancelled ones.
    Index("ix_interactions_queued_by_id", "queue", "id", "next_processing", postgresql_where=text("state = 'queued'"), sqlite_where=text("state = 'queued'")),
    Index("ix_interactions_few_by_id", "queue", "state", "id", postgresql_where=text("state IN ('processing', 'failed', 'cancelled')"), sqlite_where=text("state IN ('processing', 'failed', 'cancelled')")),
)

# Items per queue and stored status (``state``; a queued item without a due time is ``waiting``), kept by
# triggers in the transaction that changes the items (migration interactions_0011): counts read here are exact.
# On PostgreSQL each backend adds to its own ``slot`` (its pid); the retention loop folds gone backends' rows
# into slot 0. A count is the sum over slots.
interaction_counts = Table(
    "interaction_counts",
    metadata,
    Column("queue", String(128), primary_key=True),
    Column("status", String(16), primary_key=True),
    Column("slot", Integer, primary_key=True),
    Column("n", BigInteger, nullable=False),
)

# Per owner of a queue with ``owner_by``: its recent lease starts (``per_owner.rate_limit``, as the queue's), its place in the fair rotation, and when it next has
# something due. Leases write it under the queue's row lock (every lease that counts limits or takes turns holds it)
# and lock the rows they read; the writers that queue an item lower ``next_due`` by trigger (migration
# interactions_0012), locking the owner's row until they commit.
interaction_owners = Table(
    "interaction_owners",
    metadata,
    Column("queue", String(128), primary_key=True),
    Column("owner", String(128), primary_key=True),
    Column("rate_starts", Json, nullable=True),
    # Stride scheduling: each item leased adds TURN_STRIDE / weight; the owner with the least turn goes next.
    Column("turn", BigInteger, nullable=False, server_default=text("0")),
    # Never later than the earliest due time of the owner's queued items; NULL when none is queued (as the last
    # lease that found it with nothing due saw it, or the retention loop).
    Column("next_due", Millis, nullable=True),
    # The fair lease's walk: owners with something queued, in turn order.
    Index("ix_interaction_owners_turn", "queue", "turn", "owner", postgresql_where=text("next_due IS NOT NULL"),
          sqlite_where=text("next_due IS NOT NULL")),
)

# Cron-style schedules: each tick creates one interaction in ``queue`` (message_id ``periodic:<name>:<tick>``,
# so a tick is created once whichever server fires it). ``next_tick`` is the first tick not yet created.
interaction_schedules = Table(
    "interaction_schedules",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("cron", String(200), nullable=False),
    Column("timezone", String(64), nullable=False),
    Column("queue", String(128), nullable=False),
    Column("data", Json, nullable=True),
    Column("catch_up_ms", Millis, nullable=False),
    Column("next_tick", Millis, nullable=False),
    Column("source", String(16), nullable=False),
    Column("created_at", Millis, nullable=False),
    Column("updated_at", Millis, nullable=False),
    Index("ix_interaction_schedules_next_tick", "next_tick"),
)
