"""Types every layer shares, the clients included: JSON, named once.

JSON is what the engines keep in their JSON columns, what the faces send and receive, and what the clients
answer. The recursive types say which values those are, so that mypy follows them through every layer. This
module imports nothing, so that ``import mainspring.client`` stays light and the store can use it too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

JsonData: TypeAlias = dict[str, "JsonData"] | list["JsonData"] | str | int | float | bool | None
"""A JSON value of whatever kind, as ``json.loads`` returns it."""

JsonObject: TypeAlias = dict[str, JsonData]
"""A JSON object: a row's JSON column, a request's or an answer's body."""

JsonInput: TypeAlias = Mapping[str, "JsonInput"] | Sequence["JsonInput"] | str | int | float | bool | None
"""A value given to be sent or stored as JSON. Read only, so it takes what ``JsonData``, being made of mutable
(invariant) containers, does not: a ``dict[str, int]``, a ``list[str]``, a tuple."""

__all__ = ["JsonData", "JsonInput", "JsonObject"]
