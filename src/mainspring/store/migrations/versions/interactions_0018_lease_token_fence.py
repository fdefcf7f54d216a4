"""interactions: only a processing item holds a lease token (a check constraint, PostgreSQL)

Every path that ends a lease clears the token with the state (finish, requeue, cancel, an expired lease
swept), so the token alone is the fence a release checks: the one-statement completion
(``data.release.complete_held_alone``) no longer names the state, which let the planner read the batch through
``ix_interactions_leased`` and walk the entries of every item completed in the last lease period (issue 32).
The constraint makes the invariant the database's: a writer that broke it — a later change of ours, an older
server, an operator's SQL — is refused instead of silently weakening the fence.

Rows an older release may have left with a token after their lease ended are cleared first (the token of an
item that is not processing fences nothing). The constraint is added NOT VALID and then validated, which reads
the table without blocking its writers. SQLite has no such statement: the release there runs in its one
writer's transaction, under the state check it always had.

Revision ID: interactions_0018
"""

from alembic import op

revision = "interactions_0018"
down_revision = "interactions_0017"
branch_labels = None
depends_on = None

NAME = "ck_interactions_lease_token_only_when_processing"
CHECK = "(lease_token IS NOT NULL) = (state = 'processing')"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("UPDATE interactions SET lease_token = NULL, lease_expires_at = NULL WHERE state <> 'processing' AND lease_token IS NOT NULL")
    op.execute(f"ALTER TABLE interactions ADD CONSTRAINT {NAME} CHECK ({CHECK}) NOT VALID")
    op.execute(f"ALTER TABLE interactions VALIDATE CONSTRAINT {NAME}")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"ALTER TABLE interactions DROP CONSTRAINT IF EXISTS {NAME}")
