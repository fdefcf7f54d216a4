"""Group commit for creates: concurrent create requests share one transaction.

One commit (and its fsync) per request caps creates at the disk's commit rate; here the first request
commits at once, and whatever arrives while that commit runs goes into the next one together. A batch
that fails (a parent not found, say) is retried one request at a time, so each gets its own answer.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from mainspring.interactions import service
from mainspring.interactions.settings import InteractionsSettings
from mainspring.store import Store

MAX_GROUP = 500


@dataclass
class _Pending:
    queue: str
    spec: dict[str, Any]
    answer: asyncio.Future[tuple[dict[str, Any], bool]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class CreateGroups:
    """Per store: pending creates and the one task committing them."""

    def __init__(self, store: Store, cfg: InteractionsSettings) -> None:
        self.store = store
        self.cfg = cfg
        self.pending: list[_Pending] = []
        self.flusher: asyncio.Task[None] | None = None

    async def create(self, queue: str, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        pending = _Pending(queue, spec)
        self.pending.append(pending)
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self._flush())
        return await pending.answer

    async def _flush(self) -> None:
        while self.pending:
            group, self.pending = self.pending[:MAX_GROUP], self.pending[MAX_GROUP:]
            by_queue: dict[str, list[_Pending]] = defaultdict(list)
            for p in group:
                by_queue[p.queue].append(p)
            for queue, members in by_queue.items():
                await self._commit(queue, members)

    async def _commit(self, queue: str, members: list[_Pending]) -> None:
        try:
            results = await service.create_many(self.store, self.cfg, queue, [m.spec for m in members])
        except Exception as exc:
            if len(members) == 1:
                if not members[0].answer.done():
                    members[0].answer.set_exception(exc)
                return
            for member in members:
                await self._commit(queue, [member])
            return
        for member, result in zip(members, results, strict=True):
            if not member.answer.done():
                member.answer.set_result(result)


_groups: weakref.WeakKeyDictionary[Store, CreateGroups] = weakref.WeakKeyDictionary()


async def create(store: Store, cfg: InteractionsSettings, queue: str, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``service.create``, committed together with the creates that arrive at the same time."""
    groups = _groups.get(store)
    if groups is None:
        groups = _groups[store] = CreateGroups(store, cfg)
    return await groups.create(queue, spec)
