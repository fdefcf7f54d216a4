"""Group commit for background steps: the answers of many machines that are ready at the same moment are
applied in one transaction, so firing 10,000 due timers costs a few hundred commits, not 10,000.

Each answer is still guarded by its own machine's version: one that lost a race is simply not applied and
the others commit. Should the shared transaction fail for any other reason, its answers are retried one by
one so that one bad answer cannot sink the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from mainspring.machines.processor import Answer
from mainspring.machines.steps import apply_answer
from mainspring.store import Store, Transaction

Work = Callable[[Transaction], Awaitable[Any]]

log = logging.getLogger("mainspring.machines")


class GroupCommitter:
    def __init__(self, store: Store, max_batch: int = 500) -> None:
        self.store = store
        self.max_batch = max_batch
        self._queue: list[tuple[Work, asyncio.Future[Any]]] = []
        self._task: asyncio.Task[None] | None = None

    async def apply(self, row: Any, answer: Answer, **options: Any) -> bool:
        """Apply ``answer`` to ``row`` in the next group; True if it was applied."""
        return bool(await self.run(lambda tx: apply_answer(tx, row, answer, **options)))

    async def run(self, work: Work) -> Any:
        """Run ``work(tx)`` in the next group's transaction; answer what it answered once that committed."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((work, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            try:
                results = await self._commit(batch)
            except Exception as exc:
                if len(batch) == 1:
                    _settle(batch[0][1], exc)
                    continue
                log.warning("a group of %d steps failed to commit (%s); applying them one by one", len(batch), exc)
                for item in batch:
                    try:
                        (result,) = await self._commit([item])
                    except Exception as single:
                        _settle(item[1], single)
                    else:
                        _settle(item[1], result)
                continue
            for item, result in zip(batch, results, strict=True):
                _settle(item[1], result)

    async def _commit(self, batch: list[tuple[Work, asyncio.Future[Any]]]) -> list[Any]:
        async with self.store.transaction() as tx:
            return [await work(tx) for work, _ in batch]


def committer(extras: dict[str, Any], store: Store) -> GroupCommitter:
    """The server's group committer (one per context)."""
    found: GroupCommitter | None = extras.get(COMMITTER)
    if found is None:
        found = extras[COMMITTER] = GroupCommitter(store)
    return found


COMMITTER = "machines:committer"


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
