"""Group commit: concurrent writes share one transaction, so eight requests cost about one commit.

The first write commits at once; whatever arrives while that commit runs goes into the next transaction
together. Writes of one kind can go further and share one statement: those given with the same ``key`` are
handed together to one call that writes them all (eight creates, one INSERT). One shared transaction means
one failure sinks them all, so a group that fails is run again one write at a time, each getting its own
answer (a domain error, a unique violation, a deadlock victim).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from mainspring.store.dialect import Session
    from mainspring.store.engine import Store, Transaction

T = TypeVar("T")
ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")
Work = Callable[["Transaction"], Awaitable[object]]
# Each key joins items of its own type, which the queue does not know: only its ``write_all`` reads them.
WriteAll = Callable[["Transaction", list[Any]], Awaitable[Sequence[object]]]


class _Joined:
    """One write of a kind that is written together with the others of its ``key`` in the group."""

    __slots__ = ("item", "key", "write_all")

    def __init__(self, key: Hashable, write_all: WriteAll, item: object) -> None:
        self.key, self.write_all, self.item = key, write_all, item

log = logging.getLogger("mainspring.store")

MAX_GROUP = 256


class GroupCommit:
    """Up to ``parallel`` shared transactions at a time (one on SQLite, whose writers queue anyway; a few on
    PostgreSQL, where a group of many-statement writes would otherwise run them one after another on one
    connection while the others sit idle)."""

    def __init__(self, store: Store, max_group: int = MAX_GROUP, parallel: int = 1) -> None:
        self.store = store
        self.max_group = max_group
        self.parallel = parallel
        self._queue: list[tuple[Work | _Joined, asyncio.Future[object]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, work: Callable[[Transaction], Awaitable[T]]) -> T:
        return cast(T, await self._enqueue(work))

    async def run_joined(self, key: Hashable, write_all: Callable[[Transaction, list[ItemT]], Awaitable[Sequence[ResultT | BaseException]]], item: ItemT) -> ResultT:
        """Write ``item`` in the next group, in one call ``write_all(tx, items)`` with the group's other items of
        ``key``; ``write_all`` answers one result per item, in order."""
        return cast(ResultT, await self._enqueue(_Joined(key, write_all, item)))

    async def _enqueue(self, work: Work | _Joined) -> object:
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._queue.append((work, future))
        if sum(not task.done() for task in self._tasks) < self.parallel:
            task = asyncio.create_task(self._drain(), name="group-commit")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
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

    async def _commit(self, group: list[tuple[Work | _Joined, asyncio.Future[object]]]) -> list[object]:
        results: list[object] = [None] * len(group)
        joined: dict[Hashable, list[int]] = {}
        plain: list[int] = []
        for i, (work, _future) in enumerate(group):
            if isinstance(work, _Joined):
                joined.setdefault(work.key, []).append(i)
            else:
                plain.append(i)
        # One kind of joined write and nothing else: its one call is the transaction's only writer.
        async with self.store.transaction(alone=not plain and len(joined) == 1, shared=len(group) > 1) as tx:
            for i in plain:
                results[i] = await group[i][0](tx)  # type: ignore[operator]
            await _run_joined(tx, group, joined, results)
        return results


class GroupRead(GroupCommit):
    """Reads of one kind that arrive together share one call ``read_all(session, items)`` on one connection (a
    few statements for the group instead of a few per read): the first read runs at once, and whatever arrives
    while it runs is read together next. Each statement still sees what had committed when it began. An
    exception among ``read_all``'s results is raised to that one reader."""

    async def _commit(self, group: list[tuple[Work | _Joined, asyncio.Future[object]]]) -> list[object]:
        results: list[object] = [None] * len(group)
        joined: dict[Hashable, list[int]] = {}
        for i, (work, _future) in enumerate(group):
            assert isinstance(work, _Joined), "a group read takes joined reads only"
            joined.setdefault(work.key, []).append(i)
        async with self.store.read() as session:
            await _run_joined(session, group, joined, results)
        return results


async def _run_joined(session: Transaction | Session, group: list[tuple[Work | _Joined, asyncio.Future[object]]], joined: dict[Hashable, list[int]], results: list[object]) -> None:
    """One call per key for the joined items of ``group`` (indexes by key in ``joined``), results in place."""
    for indexes in joined.values():
        first = group[indexes[0]][0]
        assert isinstance(first, _Joined)
        answered = await first.write_all(session, [group[i][0].item for i in indexes])  # type: ignore[union-attr, arg-type]
        for i, result in zip(indexes, answered, strict=True):
            results[i] = result


def _settle(future: asyncio.Future[object], outcome: object) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
