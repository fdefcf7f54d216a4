"""interactions: rate limits are sliding windows — the recent lease starts kept in the store

``rate_limit`` and ``per_owner.rate_limit`` counted starts in fixed windows of the wall clock (``window_start``,
``window_count``): ``{"count": 5, "per_ms": 1000}`` let 5 start at the end of one second and 5 more at the
beginning of the next, twice the rate in the span across them (issue 35). Now the queue's row and each owner's
row keep their starts of the last ``per_ms`` (``rate_starts``: ``[[at, n], …]``, oldest first), and a lease
takes only as many as leave at most ``count`` in the window that ends at its time (``leasing.rate_left``): no
span of ``per_ms`` ever holds more than ``count`` starts.

A window in force at the upgrade becomes one entry at its start (what the old count allowed until its end).
``window_start`` and ``window_count`` stay, unused: servers of the previous release keep leasing with them
during a rolling upgrade (then each release counts its own starts).

On PostgreSQL the one-call fair lease (interactions_0014) reads and writes the logs through three functions
that do what ``leasing.rate_left``, ``rate_free_at`` and ``rate_started`` do; its text is 0014's with only its
rate statements changed, and lives in ``interactions/fair_lease.sql``, which this revision loads.

Revision ID: interactions_0015
"""

import importlib.util
from importlib import resources
from pathlib import Path

import sqlalchemy as sa
from alembic import op

from mainspring.store.schema import Json

revision = "interactions_0015"
down_revision = "interactions_0014"
branch_labels = None
depends_on = None

# As leasing.RATE_STARTS_KEPT (tests/interactions/test_rate_limits.py checks they agree).
RATE_FUNCTIONS = [
    r"""CREATE OR REPLACE FUNCTION mainspring_rate_time(p_starts jsonb, p_now bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT greatest(p_now, (p_starts -> -1 ->> 0)::bigint)
$fn$""",
    r"""CREATE OR REPLACE FUNCTION mainspring_rate_left(p_starts jsonb, p_now bigint, p_per_ms bigint, p_count integer) RETURNS integer
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT p_count - coalesce(sum((e ->> 1)::integer), 0)::integer
    FROM jsonb_array_elements(coalesce(p_starts, '[]')) AS e
    WHERE (e ->> 0)::bigint > mainspring_rate_time(p_starts, p_now) - p_per_ms
$fn$""",
    r"""CREATE OR REPLACE FUNCTION mainspring_rate_free_at(p_starts jsonb, p_now bigint, p_per_ms bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT coalesce(min((e ->> 0)::bigint), mainspring_rate_time(p_starts, p_now)) + p_per_ms
    FROM jsonb_array_elements(coalesce(p_starts, '[]')) AS e
    WHERE (e ->> 0)::bigint > mainspring_rate_time(p_starts, p_now) - p_per_ms
$fn$""",
    r"""CREATE OR REPLACE FUNCTION mainspring_rate_started(p_starts jsonb, p_now bigint, p_n integer, p_per_ms bigint) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    v_at bigint := mainspring_rate_time(p_starts, p_now);
    v_kept jsonb;
BEGIN
    SELECT coalesce(jsonb_agg(e ORDER BY x.o), '[]') INTO v_kept
    FROM jsonb_array_elements(coalesce(p_starts, '[]')) WITH ORDINALITY AS x(e, o) WHERE (e ->> 0)::bigint > v_at - p_per_ms;
    IF jsonb_array_length(v_kept) > 0 AND (v_kept -> -1 ->> 0)::bigint = v_at THEN
        v_kept := jsonb_set(v_kept, '{-1,1}', to_jsonb((v_kept -> -1 ->> 1)::integer + p_n));
    ELSE
        v_kept := v_kept || jsonb_build_array(jsonb_build_array(v_at, p_n));
    END IF;
    WHILE jsonb_array_length(v_kept) > 64 LOOP
        v_kept := jsonb_set(v_kept - 0, '{0,1}', to_jsonb((v_kept -> 0 ->> 1)::integer + (v_kept -> 1 ->> 1)::integer));
    END LOOP;
    RETURN v_kept;
END
$fn$""",
]
DROP_RATE_FUNCTIONS = [
    "DROP FUNCTION IF EXISTS mainspring_rate_started(jsonb, bigint, integer, bigint)",
    "DROP FUNCTION IF EXISTS mainspring_rate_free_at(jsonb, bigint, bigint)",
    "DROP FUNCTION IF EXISTS mainspring_rate_left(jsonb, bigint, bigint, integer)",
    "DROP FUNCTION IF EXISTS mainspring_rate_time(jsonb, bigint)",
]

def _fair_lease_0014() -> str:
    path = Path(__file__).with_name("interactions_0014_fair_lease_function.py")
    spec = importlib.util.spec_from_file_location("mainspring_migration_interactions_0014", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.FAIR_LEASE)


def fair_lease() -> str:
    """The fair lease function: its home is ``interactions/fair_lease.sql`` (0014's text with its rate statements
    changed, when this revision was written)."""
    return resources.files("mainspring.interactions").joinpath("fair_lease.sql").read_text()


# A window in force at the upgrade, as one entry at its start.
CARRY_OVER = {
    "postgresql": "jsonb_build_array(jsonb_build_array({t}.window_start, {t}.window_count))",
    "sqlite": "json_array(json_array({t}.window_start, {t}.window_count))",
}


def upgrade() -> None:
    bind = op.get_bind()
    op.add_column("interaction_queues", sa.Column("rate_starts", Json, nullable=True))
    op.add_column("interaction_owners", sa.Column("rate_starts", Json, nullable=True))
    carry = CARRY_OVER[bind.dialect.name]
    op.execute(
        f"UPDATE interaction_queues SET rate_starts = {carry.format(t='interaction_queues')} "
        "WHERE rate_limit_count IS NOT NULL AND window_count > 0"
    )
    op.execute(
        f"UPDATE interaction_owners SET rate_starts = {carry.format(t='interaction_owners')} WHERE window_count > 0 AND EXISTS "
        "(SELECT 1 FROM interaction_queues AS q WHERE q.name = interaction_owners.queue AND q.per_owner_rate_count IS NOT NULL)"
    )
    if bind.dialect.name == "postgresql":
        for function in RATE_FUNCTIONS:
            op.execute(function)
        op.execute(fair_lease())


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute(_fair_lease_0014())
        for statement in DROP_RATE_FUNCTIONS:
            op.execute(statement)
    with op.batch_alter_table("interaction_owners") as batch:
        batch.drop_column("rate_starts")
    with op.batch_alter_table("interaction_queues") as batch:
        batch.drop_column("rate_starts")
