"""Group commit: concurrent writes share one transaction, so eight requests cost about one commit.

The first write commits at once; whatever arrives while that commit runs goes into the next transaction
together. One shared transaction means one failure sinks them all, so a group that fails is run again one
write at a time, each getting its own answer (a domain error, a unique violation, a deadlock victim).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from mainspring.store.engine import Store, Transaction

T = TypeVar("T")
Work = Callable[["Transaction"], Awaitable[Any]]

log = logging.getLogger("mainspring.store")

MAX_GROUP = 256


class GroupCommit:
    def __init__(self, store: Store, max_group: int = MAX_GROUP) -> None:
        self.store = store
        self.max_group = max_group
        self._queue: list[tuple[Work, asyncio.Future[Any]]] = []
        self._task: asyncio.Task[None] | None = None

    async def run(self, work: Callable[[Transaction], Awaitable[T]]) -> T:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append((work, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="group-commit")
        return await future

    async def _drain(self) -> None:
        try:
            await self._drain_queue()
        finally:
            # Stopped by force (a server shutting down): nobody may wait for an answer that never comes.
            queued, self._queue = self._queue, []
            for _work, future in queued:
                if not future.done():
                    future.cancel()

    async def _drain_queue(self) -> None:
        while self._queue:
            group, self._queue = self._queue[: self.max_group], self._queue[self.max_group :]
            group = [(work, future) for work, future in group if not future.done()]
            if not group:
                continue
            try:
                results = await self._commit(group)
            except Exception as exc:
                if len(group) == 1:
                    _settle(group[0][1], exc)
                    continue
                log.debug("a group of %d writes failed (%s); committing them one by one", len(group), exc)
                for item in group:
                    try:
                        (result,) = await self._commit([item])
                    except Exception as single:
                        _settle(item[1], single)
                    else:
                        _settle(item[1], result)
                continue
            for (_work, future), result in zip(group, results, strict=True):
                _settle(future, result)

    async def _commit(self, group: list[tuple[Work, asyncio.Future[Any]]]) -> list[Any]:
        async with self.store.transaction() as tx:
            return [await work(tx) for work, _future in group]


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
