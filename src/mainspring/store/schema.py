"""The one MetaData every face's tables belong to, and column types that fit both engines."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import JSON, BigInteger, BindParameter, Integer, MetaData, literal
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from mainspring.types import JsonData

T = TypeVar("T")

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")

# Epoch milliseconds (see store.clock).
Millis = BigInteger


def constant(value: T) -> BindParameter[T]:
    """``value`` written into the statement's text instead of bound. A prepared statement that PostgreSQL has run
    five times may get a generic plan, planned without its parameters: a predicate such as ``state = $1`` then
    implies no partial index's ``WHERE state = 'queued'``, and the plan scans instead. Compare with a constant
    wherever a partial index should serve."""
    return literal(value, literal_execute=True)



class SqliteJson(TypeDecorator[JsonData]):
    """SQLite's JSON column: a document that is one number is bound as a BLOB.

    A column declared ``JSON`` has NUMERIC affinity, so SQLite turns the text of a document that is a single
    number into an INTEGER or REAL: ``1.0`` and ``-0.0`` came back as ``1`` and ``0``, an integer past i64
    rounded to a float. Affinity leaves a BLOB alone, and its bytes are the same JSON text. Every other
    document is text as before; a number stored before this reads back as SQLite kept it."""

    impl = JSON
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Callable[[JsonData], object]:
        serialize = self.impl_instance.bind_processor(dialect)

        def process(value: JsonData) -> object:
            stored = serialize(value) if serialize is not None else value
            if isinstance(value, int | float) and not isinstance(value, bool) and isinstance(stored, str):
                return stored.encode()
            return stored

        return process

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[str | bytes | float | None], JsonData]:
        parse = self.impl_instance.result_processor(dialect, coltype)

        def process(value: str | bytes | float | None) -> JsonData:
            if isinstance(value, bytes):
                value = value.decode()
            return parse(value) if parse is not None and isinstance(value, str) else value

        return process


Json = SqliteJson().with_variant(JSONB(), "postgresql")
