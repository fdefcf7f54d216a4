"""Cursors for keyset pagination, in the open: a cursor is the sort key of the last item of a page.

Each list declares its cursor's shape in its query model (``IntCursor``, ``IntPairCursor``…), so
``/openapi.json`` gives its pattern, and every string that matches it is a place to start from (the page after
that key) — a client gets a 422 for a cursor the pattern refuses, never for one it allows."""

from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

from mainspring.core.errors import InvalidRequest

_INT = r"[0-9]{1,18}"
# The ids that sort after a time (messages, processes, alerts): letters and digits.
_KEY = r"[0-9A-Za-z]{1,64}"

IntCursor = Annotated[str, StringConstraints(pattern=rf"^{_INT}$")]
"""An integer key (an item's id, a sequence number, a version)."""
IntPairCursor = Annotated[str, StringConstraints(pattern=rf"^{_INT}\.{_INT}$")]
"""Two integers: a time in epoch ms, then an id (``1764410000000.42``)."""
TimeKeyCursor = Annotated[str, StringConstraints(pattern=rf"^{_INT}\.{_KEY}$")]
"""A time in epoch ms, then an id of letters and digits (``1764410000000.m01a2…``)."""
MachineIdCursor = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^[^\x00]+$")]
"""A machine id as it is (any text without NUL): the list goes on after it."""


def encode_cursor(*values: int | str) -> str:
    return ".".join(str(v) for v in values)


def _invalid() -> InvalidRequest:
    return InvalidRequest("cursor is not one this server gave", errors=[{"loc": ["query", "cursor"], "msg": "invalid cursor"}])


def _int(part: str) -> int:
    # Validated again here: the dashboard passes cursors through without the query model's pattern.
    if not (part.isascii() and part.isdigit() and len(part) <= 18):
        raise _invalid()
    return int(part)


def int_cursor(cursor: str) -> int:
    return _int(cursor)


def int_pair_cursor(cursor: str) -> tuple[int, int]:
    first, _, second = cursor.partition(".")
    return _int(first), _int(second)


def time_key_cursor(cursor: str) -> tuple[int, str]:
    first, _, key = cursor.partition(".")
    if not (key.isascii() and key.isalnum() and len(key) <= 64):
        raise _invalid()
    return _int(first), key


def machine_id_cursor(cursor: str) -> str:
    if "\x00" in cursor or len(cursor) > 1024:
        raise _invalid()
    return cursor


__all__ = ["IntCursor", "IntPairCursor", "MachineIdCursor", "TimeKeyCursor", "encode_cursor", "int_cursor",
           "int_pair_cursor", "machine_id_cursor", "time_key_cursor"]
