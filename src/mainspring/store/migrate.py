"""Alembic migrations, run in-process: idempotent, and safe when several servers start at once."""

from __future__ import annotations

import logging
import operator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import ResolutionError
from sqlalchemy import Connection, func, select
from tenacity import AsyncRetrying, retry_if_result, wait_fixed

from mainspring.store.engine import Store
from mainspring.store.errors import StoreNewerThanServer
from mainspring.store.postgres import lock_key

log = logging.getLogger("mainspring.store")

MIGRATIONS = Path(__file__).parent / "migrations"
MIGRATION_LOCK = "mainspring:migrations"
MIGRATION_LOCK_RETRY_S = 0.2


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("version_locations", str(MIGRATIONS / "versions"))
    return config


def _upgrade(connection: Connection) -> None:
    # Alembic's own INFO lines (one per revision, 22 on a new store) are quieted by core.logs: this says it once.
    created = not MigrationContext.configure(connection).get_current_heads()
    pending = _pending(connection)
    if not pending:
        return
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, "heads")
    log.info("%s the store's schema (%s)", "created" if created else "brought up to date", ", ".join(sorted(pending)))


def _pending(connection: Connection) -> set[str]:
    script = ScriptDirectory.from_config(alembic_config())
    current = MigrationContext.configure(connection).get_current_heads()
    unknown = sorted(r for r in current if not _known(script, r))
    if unknown:
        raise StoreNewerThanServer(unknown)
    # Alembic records only the dependent revision (a face's *_0001), not core_0001 it depends on:
    # everything below a recorded revision, dependencies included, is applied.
    applied = {r.revision for r in script.revision_map.iterate_revisions(current, "base")} if current else set()
    return set(script.get_heads()) - applied


def _known(script: ScriptDirectory, revision: str) -> bool:
    try:
        script.revision_map.get_revision(revision)
    except ResolutionError:
        return False
    return True


async def migrate(store: Store) -> None:
    """Bring the schema to the newest revision of every face; a no-op when it already is."""
    if not store.is_postgres:
        await store.run_sync(_upgrade)
        return
    from mainspring.store.postgres import PostgresBackend

    assert isinstance(store.backend, PostgresBackend)
    async with store.backend.engine.connect() as conn:
        # A session lock, taken in autocommit: the second server waits, then finds nothing left to do. It
        # waits by trying again, not in pg_advisory_lock: a statement waiting there holds a snapshot, and
        # the first server's CREATE INDEX CONCURRENTLY waits for every older snapshot to end — each would
        # wait for the other for ever.
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")

        async def try_lock() -> bool:
            return bool((await conn.execute(select(func.pg_try_advisory_lock(lock_key(MIGRATION_LOCK))))).scalar())

        await AsyncRetrying(retry=retry_if_result(operator.not_), wait=wait_fixed(MIGRATION_LOCK_RETRY_S))(try_lock)
        try:
            await store.run_sync(_upgrade)
        finally:
            await conn.execute(select(func.pg_advisory_unlock(lock_key(MIGRATION_LOCK))))


async def pending_revisions(store: Store) -> set[str]:
    return await store.run_sync(_pending)


def create_indexes_concurrently(op: Any, table: str, indexes: list[tuple[str, list[str], str | None]]) -> None:
    """In a migration on PostgreSQL: commit what the migration did so far, then build each index
    CONCURRENTLY (writes go on). An index a stopped build left INVALID is dropped and built again, so a run
    stopped here is safe to start again (the migration must then skip what it committed before)."""
    bind = op.get_bind()
    bind.commit()  # CONCURRENTLY cannot run in a transaction
    auto = bind.execution_options(isolation_level="AUTOCOMMIT")
    for name, columns, where in indexes:
        invalid = auto.exec_driver_sql(
            f"SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('{name}') AND NOT indisvalid").first()
        if invalid:
            auto.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        partial = f" WHERE {where}" if where else ""
        auto.exec_driver_sql(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} ({', '.join(columns)}){partial}")
        auto.commit()  # SQLAlchemy's own transaction object (the driver commits each statement by itself)
    bind.execution_options(isolation_level="READ COMMITTED")
