"""Counts by status kept with the writes: exact counts without a scan of a big table (issue 26).

A face's counts table holds, per ``kind`` (which of its tables), ``grp`` (a grouping column's value, such as a
machine's namespace or a task's batcher; ``''`` without one) and ``status``, how many rows there are.
Triggers change it in the same transaction as the rows (whoever writes them: the server, a worker on the
store, an operator's SQL), so a count read from it is exact — the mechanism of migration interactions_0011,
shared here by the faces' migrations.

On PostgreSQL each backend adds to rows of its own (``slot`` = its ``pg_backend_pid()``), so concurrent
transactions never wait for each other on a count row (and never deadlock on them); ``fold`` moves the rows
of backends that are gone into slot 0. SQLite has one writer: slot 0 only. A count is the sum over slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import sqlalchemy as sa
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, func, select, text

from mainspring.store.dialect import Executor

# A small, hot table: vacuumed after a few hundred changes rather than PostgreSQL's 20 % of the table.
AUTOVACUUM = ("autovacuum_vacuum_threshold = 200, autovacuum_vacuum_scale_factor = 0, "
              "autovacuum_analyze_threshold = 200")


CountsTable: TypeAlias = Table
"""A face's counts table, as ``counts_table`` defines it (named so that ``core`` need not speak SQLAlchemy)."""


def counts_table(name: str, metadata: MetaData) -> CountsTable:
    """The shape of every face's counts table (created by ``create_counts_table`` in its migration)."""
    return Table(
        name, metadata,
        Column("kind", String(32), primary_key=True),
        Column("grp", String(1024), primary_key=True),
        Column("status", String(32), primary_key=True),
        Column("slot", Integer, primary_key=True),
        Column("n", BigInteger, nullable=False),
    )


# Joins the values of a group of several columns into one ``grp`` (names never hold a ``/``: core.types.Name).
GROUP_SEPARATOR = "/"
# A bucket's start in ms has 13 digits until the year 2286; padded to 15, text order is time order.
BUCKET_DIGITS = 15


@dataclass(frozen=True)
class KeptCount:
    """Rows of ``source`` counted in the table ``counts`` as ``kind``, per ``group`` and ``status`` column.

    ``group`` is one column, several (their values joined by ``GROUP_SEPARATOR``: see ``group_key``) or none.
    With ``bucket_ms``, ``group`` is one time column (ms) and the group is the start of its bucket, zero-padded
    (``bucket_key``). Without ``deletes_count_down`` only inserts are counted: rows inserted per group (the
    events' throughput, whose old buckets retention prunes rather than counting each deleted row down)."""

    counts: str
    source: str
    kind: str
    status: str
    group: str | tuple[str, ...] | None = None
    bucket_ms: int | None = None
    deletes_count_down: bool = True
    per_statement: bool = False
    """PostgreSQL: follow updates once per UPDATE statement (over its old and new rows) rather than row by row.
    For tables whose rows change status many at a time (a package's tasks, a process's messages): a row
    trigger runs its upsert once per row moved. A row trigger stays cheaper where updates come one row at a
    time and most move no count (a machine's steps): its WHEN is checked in C, while a statement trigger runs
    for every UPDATE (PostgreSQL allows no column list with transition tables)."""

    def _group_columns(self) -> list[str]:
        return [] if self.group is None else [self.group] if isinstance(self.group, str) else list(self.group)

    def _grp(self, row: str, postgres: bool) -> str:
        columns = [f"{row}.{c}" for c in self._group_columns()]
        if not columns:
            return "''"
        if self.bucket_ms is not None:
            start = f"({columns[0]} / {self.bucket_ms} * {self.bucket_ms})"
            return (f"lpad(CAST({start} AS TEXT), {BUCKET_DIGITS}, '0')" if postgres
                    else f"printf('%0{BUCKET_DIGITS}d', {start})")
        return f" || '{GROUP_SEPARATOR}' || ".join(columns)

    def _columns(self) -> list[str]:
        return [self.status, *self._group_columns()]

    def _moved(self) -> str:
        return " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in self._columns())

    def _function(self, event: str, rows: str) -> str:
        return (
            f"CREATE OR REPLACE FUNCTION mainspring_{self.source}_count_{event}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN INSERT INTO {self.counts} AS c (kind, grp, status, slot, n) "
            f"SELECT '{self.kind}', grp, status, pg_backend_pid(), n FROM ({rows}) AS r(grp, status, n) "
            "ON CONFLICT (kind, grp, status, slot) DO UPDATE SET n = c.n + excluded.n; RETURN NULL; END $$"
        )

    def _sqlite_upsert(self, row: str, delta: str) -> str:
        return (f"INSERT INTO {self.counts} (kind, grp, status, slot, n) VALUES ('{self.kind}', {self._grp(row, False)}, "
                f"{row}.{self.status}, 0, {delta}) ON CONFLICT (kind, grp, status, slot) DO UPDATE SET n = n + {delta};")

    def _events(self) -> tuple[str, ...]:
        return ("insert", "delete", "update") if self.deletes_count_down else ("insert", "update")

    def install(self, postgres: bool) -> list[str]:
        """Statements that create the triggers and count the rows already there. On PostgreSQL the first
        takes a SHARE ROW EXCLUSIVE lock on ``source`` (writes wait, reads do not) until the migration's
        commit, so no write slips between the triggers' creation and the count."""
        fill = (f"INSERT INTO {self.counts} (kind, grp, status, slot, n) SELECT '{self.kind}', "
                f"{self._grp(self.source, postgres)}, {self.status}, 0, count(*) FROM {self.source} GROUP BY 2, 3")
        of = ", ".join(self._columns())
        if not postgres:
            triggers = {
                "insert": f"CREATE TRIGGER {self.source}_count_insert AFTER INSERT ON {self.source} BEGIN "
                          + self._sqlite_upsert("NEW", "1") + " END",
                "delete": f"CREATE TRIGGER {self.source}_count_delete AFTER DELETE ON {self.source} BEGIN "
                          + self._sqlite_upsert("OLD", "-1") + " END",
                "update": f"CREATE TRIGGER {self.source}_count_update AFTER UPDATE OF {of} ON {self.source} "
                          f"WHEN {self._moved()} BEGIN {self._sqlite_upsert('OLD', '-1')} {self._sqlite_upsert('NEW', '1')} END",
            }
            return [triggers[event] for event in self._events()] + [fill]
        grp = self._grp
        functions = {
            "insert": self._function("inserted", f"SELECT {grp('changed', True)}, changed.{self.status}, count(*) "
                                                 "FROM changed GROUP BY 1, 2"),
            "delete": self._function("deleted", f"SELECT {grp('gone', True)}, gone.{self.status}, -count(*) "
                                                "FROM gone GROUP BY 1, 2"),
            "update": self._function("moved", self._moved_per_statement() if self.per_statement else
                                     f"VALUES ({grp('OLD', True)}, OLD.{self.status}, -1), "
                                     f"({grp('NEW', True)}, NEW.{self.status}, 1)"),
        }
        triggers = {
            "insert": f"CREATE TRIGGER {self.source}_count_insert AFTER INSERT ON {self.source} REFERENCING NEW TABLE "
                      f"AS changed FOR EACH STATEMENT EXECUTE FUNCTION mainspring_{self.source}_count_inserted()",
            "delete": f"CREATE TRIGGER {self.source}_count_delete AFTER DELETE ON {self.source} REFERENCING OLD TABLE "
                      f"AS gone FOR EACH STATEMENT EXECUTE FUNCTION mainspring_{self.source}_count_deleted()",
            "update": (f"CREATE TRIGGER {self.source}_count_update AFTER UPDATE ON {self.source} "
                       "REFERENCING OLD TABLE AS gone NEW TABLE AS changed "
                       f"FOR EACH STATEMENT EXECUTE FUNCTION mainspring_{self.source}_count_moved()") if self.per_statement
            # Row by row, but only rows whose count moves reach the function: the WHEN is checked in C.
            else (f"CREATE TRIGGER {self.source}_count_update AFTER UPDATE OF {of} ON {self.source} "
                  f"FOR EACH ROW WHEN ({self._moved()}) EXECUTE FUNCTION mainspring_{self.source}_count_moved()"),
        }
        return ([f"LOCK TABLE {self.source} IN SHARE ROW EXCLUSIVE MODE"]
                + [functions[event] for event in self._events()]
                + [triggers[event] for event in self._events()] + [fill])

    def _moved_per_statement(self) -> str:
        return (f"SELECT grp, status, sum(n) FROM (SELECT {self._grp('gone', True)}, gone.{self.status}, -1 FROM gone "
                f"UNION ALL SELECT {self._grp('changed', True)}, changed.{self.status}, 1 FROM changed) "
                "AS m(grp, status, n) GROUP BY 1, 2 HAVING sum(n) <> 0")

    def uninstall(self, postgres: bool) -> list[str]:
        drops = [f"DROP TRIGGER IF EXISTS {self.source}_count_{event}" + (f" ON {self.source}" if postgres else "")
                 for event in ("insert", "delete", "update")]
        if postgres:
            drops += [f"DROP FUNCTION IF EXISTS mainspring_{self.source}_count_{kind}()"
                      for kind in ("inserted", "deleted", "moved")]
        return drops


def group_key(*values: str) -> str:
    """The ``grp`` of a count grouped by several columns, from their values."""
    return GROUP_SEPARATOR.join(values)


def group_values(grp: str) -> tuple[str, ...]:
    """The values of the columns of a count grouped by several, from its ``grp``."""
    return tuple(grp.split(GROUP_SEPARATOR))


def bucket_key(start_ms: int) -> str:
    """The ``grp`` of a count per bucket, from the bucket's start (ms)."""
    return str(start_ms).zfill(BUCKET_DIGITS)


def create_counts_table(op: Any, name: str, kept: list[KeptCount]) -> None:
    """In a migration: the counts table ``name`` and the triggers of each of ``kept``, filled."""
    postgres = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        name,
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("grp", sa.String(1024), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("slot", sa.Integer, nullable=False),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("kind", "grp", "status", "slot"),
    )
    if postgres:
        op.execute(f"ALTER TABLE {name} SET ({AUTOVACUUM})")
    for count in kept:
        for statement in count.install(postgres):
            op.execute(statement)


def drop_counts_table(op: Any, name: str, kept: list[KeptCount]) -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for count in kept:
        for statement in count.uninstall(postgres):
            op.execute(statement)
    op.drop_table(name)


async def read_counts(conn: Executor, table: Table, kind: str, grp: str | None = None,
                      from_grp: str | None = None, status: str | None = None) -> dict[tuple[str, str], int]:
    """(group, status) → rows of ``kind``, of every group, one, or those from ``from_grp`` on (text order:
    with ``bucket_key``, time order), of every status or one; statuses with none are left out."""
    total = func.sum(table.c.n)
    query = (select(table.c.grp, table.c.status, total).where(table.c.kind == kind)
             .group_by(table.c.grp, table.c.status).having(total != 0))
    if grp is not None:
        query = query.where(table.c.grp == grp)
    if from_grp is not None:
        query = query.where(table.c.grp >= from_grp)
    if status is not None:
        query = query.where(table.c.status == status)
    return {(str(g), str(s)): int(n) for g, s, n in (await conn.execute(query)).all()}


def by_status(counted: dict[tuple[str, str], int]) -> dict[str, int]:
    """``read_counts``' answer summed over the groups."""
    summed: dict[str, int] = {}
    for (_grp, status), n in counted.items():
        summed[status] = summed.get(status, 0) + n
    return summed


async def prune_groups_before(tx: Executor, table: Table, kind: str, before_grp: str) -> int:
    """Delete the counts of ``kind`` in groups before ``before_grp`` (text order: with ``bucket_key``, the
    buckets older than a retention's cutoff); answers how many rows went."""
    result: Any = await tx.execute(table.delete().where(table.c.kind == kind, table.c.grp < before_grp))
    return int(result.rowcount or 0)


async def fold(tx: Executor, table: Table) -> int:
    """PostgreSQL: fold the count rows of backends that are gone into slot 0 (each backend adds to rows of
    its own, so they would pile up with every new connection); rows another transaction holds are left
    for the next round. Answers how many rows were folded."""
    keys = [c.name for c in table.primary_key.columns if c.name != "slot"]
    cols = ", ".join(keys)
    name = table.name
    result: Any = await tx.execute(text(
        "WITH gone AS ("
        f" DELETE FROM {name} c USING ("
        f"  SELECT {cols}, slot FROM {name}"
        "  WHERE slot <> 0 AND slot NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)"
        "  FOR UPDATE SKIP LOCKED) AS g"
        f" WHERE ({', '.join('c.' + k for k in keys)}, c.slot) = ({', '.join('g.' + k for k in keys)}, g.slot)"
        f" RETURNING {', '.join('c.' + k for k in keys)}, c.n),"
        f" summed AS (SELECT {cols}, sum(n) AS n FROM gone GROUP BY {cols}) "
        f"INSERT INTO {name} AS c ({cols}, slot, n) SELECT {cols}, 0, n FROM summed "
        f"ON CONFLICT ({cols}, slot) DO UPDATE SET n = c.n + excluded.n RETURNING c.{keys[0]}"
    ))
    return len(result.all())
