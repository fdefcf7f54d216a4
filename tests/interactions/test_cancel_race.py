"""An item finished by a call of the API (cancel, complete) while its worker releases its lease: exactly one of
the two applies and the other is refused with its code — the release with ``lease_lost`` (in a batch: answered
not held), the call with ``interaction_finished`` — and the item has the winner's state, result and one event.

Each way a worker releases is raced: one release (a transaction), a batch of plain completions (on PostgreSQL
one statement that is its own transaction, fenced by the token alone), and a batch of failures (the batch's
transaction). On PostgreSQL both sides are sent from behind the items' rows, held by another connection as any
transaction touching them would, and let go once all of them wait: for half the items the release waits first,
for the other half the call, so both orders are raced from one snapshot, not by luck of timing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import asyncpg
import pytest
from sqlalchemy import select

from mainspring.config import Settings
from mainspring.core import outbox
from mainspring.core.errors import LeaseLost
from mainspring.core.tables import events
from mainspring.interactions import leasing, outcomes, service
from mainspring.interactions.errors import InteractionFinished
from mainspring.store import ManualClock, Store

ITEMS = 6
_WAITING = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"

Release = Callable[[Store, int, str], Awaitable[bool]]


async def _release_one(store: Store, item_id: int, token: str) -> bool:
    try:
        await leasing.release(store, item_id, token, outcomes.Complete({"by": "worker"}))
    except LeaseLost:
        return False
    return True


async def _release_completions(store: Store, item_id: int, token: str) -> bool:
    (held,) = await leasing.release_many(store, "q", [(item_id, token, outcomes.Complete({"by": "worker"}))])
    return held


async def _release_failures(store: Store, item_id: int, token: str) -> bool:
    (held,) = await leasing.release_many(store, "q", [(item_id, token, outcomes.Fail("by the worker"))])
    return held


RELEASES: dict[str, tuple[Release, str]] = {
    "one release": (_release_one, "completed"),
    "a batch of completions": (_release_completions, "completed"),
    "a batch of failures": (_release_failures, "failed"),
}
CALLS = {"cancel": "cancelled", "complete": "completed"}


async def _call(store: Store, call: str, item_id: int) -> bool:
    try:
        if call == "cancel":
            await service.cancel(store, str(item_id))
        else:
            await service.complete(store, str(item_id), {"by": "api"})
    except InteractionFinished:
        return False
    return True


async def _race(engine: str, database_url: str, ids: list[int], firsts: list[Callable[[], Awaitable[bool]]],
                seconds: list[Callable[[], Awaitable[bool]]]) -> tuple[list[bool], list[bool]]:
    """Run each item's two sides at once; on PostgreSQL behind the items' rows, each item's first side queued
    for its row before its second."""
    if engine != "postgres":
        answers = await asyncio.gather(*(f() for f in firsts), *(s() for s in seconds))
        return list(answers[: len(firsts)]), list(answers[len(firsts):])
    raw = database_url.replace("postgresql+asyncpg://", "postgresql://")
    holder, watcher = await asyncpg.connect(raw), await asyncpg.connect(raw)
    tasks: list[asyncio.Task[bool]] = []
    try:
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM interactions WHERE id = ANY($1::bigint[]) FOR UPDATE", ids)
        for side in (firsts, seconds):
            tasks += [asyncio.create_task(f()) for f in side]
            deadline = time.monotonic() + 60
            while await watcher.fetchval(_WAITING) + sum(t.done() for t in tasks) < len(tasks):
                assert time.monotonic() < deadline, "the two sides never both waited for the items' rows"
                await asyncio.sleep(0.005)
        await holder.execute("COMMIT")
        answers = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    finally:
        for task in tasks:
            task.cancel()
        await holder.close()
        await watcher.close()
    return list(answers[: len(firsts)]), list(answers[len(firsts):])


async def _finishing_events(store: Store, item_id: int) -> list[str]:
    await outbox.assign_positions(store)
    async with store.read() as conn:
        query = select(events.c.type).where(events.c.subject_kind == "interaction", events.c.subject_id == str(item_id))
        return [t for t in (await conn.execute(query)).scalars() if t in ("interaction.completed", "interaction.cancelled")]


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("how", list(RELEASES))
async def test_an_item_finished_while_its_lease_is_released_takes_exactly_one_outcome(
    how: str, call: str, engine: str, database_url: str, store: Store, settings: Settings, clock: ManualClock
) -> None:
    cfg = settings.interactions
    await service.put_queue(store, cfg, "q", {"lease_ms": 60_000})
    await service.create_many(store, cfg, "q", [{"data": n} for n in range(ITEMS)])
    leased = (await leasing.lease(store, cfg, "q", "w", ITEMS)).items
    assert len(leased) == ITEMS
    ids = sorted(int(item["id"]) for item in leased)
    tokens = {int(item["id"]): item["lease"]["token"] for item in leased}
    release, released_state = RELEASES[how]
    # The worker's own store, as a worker process has: one store's transactions could share a group commit.
    worker = Store(database_url, clock=clock, pool_size=ITEMS + 1, sqlite_synchronous="NORMAL")
    await worker.start()
    try:
        releases = [lambda i=i: release(worker, i, tokens[i]) for i in ids]
        calls = [lambda i=i: _call(store, call, i) for i in ids]
        # Even items: the release queues first; odd ones: the call.
        order = [n % 2 == 0 for n in range(ITEMS)]
        firsts = [r if release_first else c for r, c, release_first in zip(releases, calls, order, strict=True)]
        seconds = [c if release_first else r for r, c, release_first in zip(releases, calls, order, strict=True)]
        first_answers, second_answers = await _race(engine, database_url, ids, firsts, seconds)
    finally:
        await worker.close()

    for n, item_id in enumerate(ids):
        released, called = (first_answers[n], second_answers[n]) if order[n] else (second_answers[n], first_answers[n])
        assert released != called, f"item {item_id}: release {'and' if released else 'nor'} {call} both applied"
        item = await service.read(store, item_id)
        if released:
            assert item["status"] == released_state
            assert item["result"] == ({"by": "worker"} if released_state == "completed" else None)
        else:
            assert item["status"] == CALLS[call]
            assert item["result"] == ({"by": "api"} if call == "complete" else None)
        assert (await service.get(store, item_id)).lease_token is None
        expected = "interaction.cancelled" if item["status"] == "cancelled" else "interaction.completed"
        assert await _finishing_events(store, item_id) == [expected]
    if engine == "postgres":
        # From behind the rows, whichever side queued first wins.
        assert [first_answers[n] for n in range(ITEMS)] == [True] * ITEMS
