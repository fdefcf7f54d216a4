"""``store.schema.Json`` keeps a JSON document as written on both engines: SQLite's JSON column has NUMERIC
affinity and turned a document that is one number (``1.0``, ``-0.0``, an integer past i64) into another
number; PostgreSQL's jsonb keeps numbers by value (the one change it makes is below)."""

from __future__ import annotations

import decimal
import itertools
import math
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import BigInteger, Column, MetaData, Table, select

from mainspring.store import Store
from mainspring.store.schema import Json

documents = MetaData()
kept = Table("test_json_documents", documents, Column("id", BigInteger, primary_key=True), Column("document", Json))

I64_EDGES = st.sampled_from([-(2**63), 2**63 - 1, -(2**63) - 1, 2**63, 2**53 + 1, 2**70, 0])
FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1.0, -1.0, 0.0, -0.0, 1e16, -1e16, 2.0**63, 1.5e300, 5e-324])
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))  # jsonb holds neither NUL nor lone surrogates
SCALARS = st.none() | st.booleans() | st.integers() | I64_EDGES | FLOATS | TEXT
DOCUMENTS = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT.filter(lambda k: len(k) <= 5), inner, max_size=4), max_leaves=10
)
IDS = itertools.count(1)


def _as_stored(value: Any, postgres: bool) -> Any:
    """What the engine gives back: the document itself, but on PostgreSQL a whole float jsonb writes without
    a fraction (±1e16 and past) is read as the integer it equals, and -0.0 as 0.0 (numeric has no sign of
    zero). Machinegun's Values tag such floats themselves (docs/machinegun.md)."""
    if isinstance(value, list):
        return [_as_stored(v, postgres) for v in value]
    if isinstance(value, dict):
        return {k: _as_stored(v, postgres) for k, v in value.items()}
    if postgres and isinstance(value, float):
        if value == 0:
            return 0.0
        if value.is_integer() and abs(value) >= 1e16:
            return int(decimal.Decimal(repr(value)))  # the shortest repr's digits, as numeric kept them
    return value


def _same(got: Any, want: Any) -> bool:
    """Equal, and of the same type all the way down (``1 == 1.0`` and ``0.0 == -0.0`` are not enough)."""
    if type(got) is not type(want):
        return False
    if isinstance(want, list):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    if isinstance(want, float):
        return got == want and math.copysign(1, got) == math.copysign(1, want)
    return bool(got == want)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=DOCUMENTS)
async def test_a_json_document_comes_back_as_written(store: Store, document: Any) -> None:
    await store.run_sync(documents.create_all)
    row_id = next(IDS)
    async with store.transaction() as tx:
        await tx.execute(kept.insert().values(id=row_id, document=document))
    async with store.read() as conn:
        back = (await conn.execute(select(kept.c.document).where(kept.c.id == row_id))).scalar_one()
    want = _as_stored(document, store.is_postgres)
    assert _same(back, want), f"{document!r} came back as {back!r}"


async def test_a_whole_float_keeps_its_fraction_through_a_faces_api(client: httpx.AsyncClient) -> None:
    created = (await client.post("/v1/queues/json/interactions", json={"data": 1.0})).json()
    got = await client.get(f"/v1/interactions/{created['id']}")
    assert '"data":1.0' in got.text.replace(" ", "")
