"""Whether a commit the store acknowledges is already on a second machine (PostgreSQL synchronous replication).

With a synchronous standby, PostgreSQL answers COMMIT only once the standby has the commit's WAL, so a
2xx survives the loss of the primary's machine. Without one (no standby, ``synchronous_standby_names`` empty —
pg_auto_failover empties it while its standby is away — or ``synchronous_commit`` off/local) an acknowledged
write lives on the primary alone until it is replicated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from mainspring.store.engine import Store

_ASYNC_COMMIT = ("off", "local")


@dataclass(frozen=True)
class Replication:
    """What the primary the store writes to says about its standbys."""

    in_recovery: bool
    synchronous_commit: str
    synchronous_standby_names: str
    sync_standbys: int
    """Standbys streaming as ``sync`` or ``quorum``."""
    hidden_standbys: int
    """Standbys whose state this role may not see (not superuser nor ``pg_read_all_stats``)."""

    def why_not_synchronous(self) -> str | None:
        """Why an acknowledged commit may be on this machine only; None when it is on a standby too."""
        if self.in_recovery:
            return "the store is a standby (read-only)"
        if self.synchronous_commit in _ASYNC_COMMIT:
            return f"synchronous_commit = {self.synchronous_commit}: commits do not wait for a standby"
        if not self.synchronous_standby_names.strip():
            return "synchronous_standby_names is empty: no standby is synchronous"
        if self.sync_standbys == 0 and self.hidden_standbys == 0:
            return "no synchronous standby is connected: commits wait until one is"
        return None


async def replication(store: Store) -> Replication:
    """Read the replication state of the primary ``store`` writes to (PostgreSQL only)."""
    async with store.read() as conn:
        row: Any = (
            await conn.execute(
                text(
                    """
                    SELECT pg_is_in_recovery(),
                           current_setting('synchronous_commit'),
                           current_setting('synchronous_standby_names'),
                           (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),
                           (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL)
                    """
                )
            )
        ).one()
    return Replication(bool(row[0]), str(row[1]), str(row[2]), int(row[3]), int(row[4]))


async def why_not_synchronous(store: Store) -> str | None:
    """Why an acknowledged write may live on one machine only; None when every commit waits for a standby."""
    if not store.is_postgres:
        return f"the store is {store.dialect.name}, which has no replica"
    return (await replication(store)).why_not_synchronous()
