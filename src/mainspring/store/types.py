"""The shapes of values that cross the store's interface (JSON itself is ``mainspring.types``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

Params: TypeAlias = Mapping[str, object]
"""Bound parameters of a statement by name: the driver adapts each value, so they are only passed through."""

ExecuteParams: TypeAlias = Params | Sequence[Params] | None
"""What ``execute`` binds: one set of parameters, a list of them (executemany), or none."""
