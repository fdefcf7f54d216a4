"""Opaque cursors for keyset pagination."""

from __future__ import annotations

import base64
import json
from typing import Any

from mainspring.core.errors import InvalidRequest
from mainspring.types import JsonInput


def encode_cursor(*values: JsonInput) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(values), separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, arity: int) -> list[Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        values = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, UnicodeError) as exc:
        raise InvalidRequest("cursor is not one this server gave", errors=[{"loc": ["query", "cursor"], "msg": "invalid cursor"}]) from exc
    if not isinstance(values, list) or len(values) != arity:
        raise InvalidRequest("cursor is not one this server gave", errors=[{"loc": ["query", "cursor"], "msg": "invalid cursor"}])
    return values
