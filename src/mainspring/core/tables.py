"""The core's tables (migration core_0001)."""

from sqlalchemy import BigInteger, Column, Index, String, Table, Text

from mainspring.store.counts import KeptCount, counts_table
from mainspring.store.schema import BigId, Json, Millis, metadata

events = Table(
    "events",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("position", BigInteger, nullable=True, unique=True),
    Column("type", String(100), nullable=False),
    Column("at", Millis, nullable=False),
    Column("subject_kind", String(50), nullable=False),
    Column("subject_id", String(400), nullable=False),
    Column("data", Json, nullable=False),
    # Retention's oldest first (migration core_0007).
    Index("ix_events_at", "at", "type"),
)

# Events written per minute by type (migration core_0008): the dashboard's throughput without a walk of the log.
event_counts = counts_table("event_counts", metadata)
MINUTE_MS = 60_000
EVENTS_PER_MINUTE = KeptCount("event_counts", "events", "minutes", status="type", group="at", bucket_ms=MINUTE_MS,
                              deletes_count_down=False)
EVENT_COUNTS_KEPT_MS = 2 * 60 * MINUTE_MS
"""How long the per-minute counts are kept, whatever the events' own retention (even none): their one reader,
the dashboard's throughput chart, shows the last hour; the second hour is margin, never read."""

alerts = Table(
    "alerts",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("at", Millis, nullable=False),
    Column("severity", String(20), nullable=False),
    Column("code", String(100), nullable=False),
    Column("subject_kind", String(50), nullable=False),
    Column("subject_id", String(400), nullable=False),
    Column("detail", Text, nullable=False),
    Column("acked_at", Millis, nullable=True),
    # Closed once its subject is fixed (migration core_0004): when, by whom, and why.
    Column("resolved_at", Millis, nullable=True),
    Column("resolved_by", String(200), nullable=True),
    Column("resolution", Text, nullable=True),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("token_sha256", String(64), nullable=False, unique=True),
    Column("scopes", Json, nullable=False),
    Column("created_at", Millis, nullable=False),
    Column("revoked_at", Millis, nullable=True),
)

# Each publisher's durable cursor into the outbox (migration core_0002), leased by one server at a time.
publisher_cursors = Table(
    "publisher_cursors",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("position", BigInteger, nullable=False),
    Column("lease_token", String(64), nullable=True),
    Column("lease_expires_at", Millis, nullable=True),
    Column("updated_at", Millis, nullable=False),
    Column("last_error", Text, nullable=True),
)
