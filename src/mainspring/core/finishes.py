"""Watched finishes: a layer above the faces learns, in the finishing transaction itself, that a queue item it
created has finished — so a workflow waiting for its task is woken by a committed notification, never by
polling, while the interactions face knows nothing of workflows.

A watcher is registered for a ``message_id`` prefix (``wf:``). Every path that moves an item to a final state
hands the watched ones to ``report`` (the plain fast paths leave watched items to the path that reports). The
watcher's writes are queued with ``Transaction.write_before_last`` and run together, in one call, at the end of
the transaction: after the item rows were locked and before the events' numbering lock, so a watcher that locks
rows of its own (a machine) takes them last and in an order it chooses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from mainspring.store import Transaction
from mainspring.types import JsonData


@dataclass(frozen=True, slots=True)
class Finished:
    """A watched item that reached a final state in the transaction."""

    message_id: str
    item_id: int
    queue: str
    state: str
    """completed | failed | cancelled"""
    result: JsonData = None
    error: str | None = None


Watcher = Callable[[Transaction, list[Finished]], Awaitable[None]]

_WATCHERS: dict[str, Watcher] = {}


def watch(prefix: str, watcher: Watcher) -> None:
    """Call ``watcher`` with the items whose message id starts with ``prefix`` that finish (the same watcher
    again is a no-op)."""
    _WATCHERS[prefix] = watcher


def watched(message_id: str | None) -> bool:
    return message_id is not None and any(message_id.startswith(p) for p in _WATCHERS)


def like_patterns() -> list[str]:
    """The watched prefixes as SQL LIKE patterns (what a statement that finishes items must leave alone)."""
    return [p.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%" for p in _WATCHERS]


def report(tx: Transaction, finished: Sequence[Finished]) -> None:
    """Queue the watchers of these finishes to run at the end of ``tx`` (unwatched ones are ignored)."""
    for item in finished:
        for prefix, watcher in _WATCHERS.items():
            if item.message_id.startswith(prefix):
                tx.write_before_last(("finishes", prefix), watcher, item)
