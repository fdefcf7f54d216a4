"""The worker runtime: runs the handlers registered with ``@app.queue`` against the store.

```python
from mainspring import App
from mainspring.interactions.outcomes import Repeat

app = App()

@app.queue("emails", concurrency=20, lease_ms=30_000, timeout_ms=10_000)
async def send(item):
    await smtp.send(item.data)          # a plain return value completes the item
    return Repeat(in_ms=60_000)         # …or an outcome: Complete, Fail, Repeat, Wait, Retry
```

It runs inside ``mainspring serve --app mod:app`` or standalone (``mainspring worker mod:app``), on the store
or, with ``--url``, through a server's HTTP API (``interactions.sources``). Each queue leases up to its free
local slots at once and releases finished items in batches (one transaction for many). A handler that
raises, or runs past its timeout, is retried after the queue's retry delay.
A handler whose item is cancelled (or whose lease is lost) is cancelled. Sync handlers run in a thread;
Python cannot interrupt a thread, so a timed-out or cancelled sync handler is abandoned, not stopped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import inspect
import logging
import os
import socket
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any, cast

from mainspring.client import models as answers
from mainspring.core import logs, tracing
from mainspring.core.logs import bind
from mainspring.core.runtime import log_failure
from mainspring.interactions import data, outcomes
from mainspring.interactions.models import Interaction
from mainspring.interactions.service import cancelled_channel, queue_channel
from mainspring.interactions.settings import InteractionsSettings
from mainspring.interactions.sources import QueueSource, StoreQueues
from mainspring.store import Store

log = logging.getLogger("mainspring.interactions.worker")

RELEASE_BATCH = 500
LEASE_SOON_S = 0.005
"""How long the release loop leaves outcomes to a lease about to be sent (which stores them in the same call)."""
QUEUE_SETTINGS = ("error_delay_ms", *data.RETRY_SETTINGS, "max_attempts", "priority_aging_ms", "owner_by", "per_owner", "fair", "weights")
"""The options of ``@app.queue`` that are the queue's settings (stored when a worker starts), not the worker's own."""


@dataclass
class QueueOptions:
    """What ``@app.queue(name, **options)`` accepts."""

    concurrency: int = 10
    """Items this process handles at once (the queue's own ``concurrency`` setting caps all servers)."""
    lease_ms: int | None = None
    """Lease per item (default: the queue's); heartbeats renew it every third of it."""
    timeout_ms: int | None = None
    """Processing timeout (default: the queue's ``processing_timeout_ms``)."""
    batch: int = 100
    """Most items leased in one call."""
    retry_for: tuple[type[Exception], ...] | None = None
    """Only these exceptions are retried; any other fails the item at once (None: every one is retried)."""
    fail_for: tuple[type[Exception], ...] = ()
    """These exceptions fail the item at once."""
    error_delay_ms: int | None = None
    backoff: str | None = None
    max_delay_ms: int | None = None
    jitter: bool | None = None
    max_attempts: int | None = None
    priority_aging_ms: int | None = None
    owner_by: str | None = None
    per_owner: dict[str, Any] | None = None
    fair: bool | None = None
    weights: dict[str, int] | None = None

    def queue_settings(self) -> dict[str, Any]:
        """The queue's settings these options name (as the API gives them), stored when this worker starts."""
        return {k: v for k, v in ((k, getattr(self, k)) for k in QUEUE_SETTINGS) if v is not None}

    def outcome_of(self, exc: Exception) -> outcomes.Retry | outcomes.Fail:
        """What a handler's exception means for its item: retried, unless ``fail_for`` names it or
        ``retry_for`` is given and does not."""
        error, detail = f"{type(exc).__name__}: {exc}"[:10_000], error_detail(exc)
        if isinstance(exc, self.fail_for) or (self.retry_for is not None and not isinstance(exc, self.retry_for)):
            return outcomes.Fail(error, detail)
        return outcomes.Retry(error, detail)

    @classmethod
    def of(cls, options: dict[str, Any]) -> QueueOptions:
        known = {k: v for k, v in options.items() if k in cls.__dataclass_fields__}
        unknown = set(options) - set(known)
        if unknown:
            raise TypeError(f"unknown queue options: {', '.join(sorted(unknown))}")
        return cls(**known)


class _InFlight:
    """One item leased by this process, from its lease until its outcome is stored (or it is given up): a plain
    record, no task of its own; a handler loop of the runner runs it."""

    __slots__ = ("given_up", "id", "item", "outcome", "releasing", "task", "token")

    def __init__(self, item: Interaction, token: str) -> None:
        self.id = int(item.id)
        self.item = item
        self.token = token
        self.task: asyncio.Task[None] | None = None
        """The handler loop running it, while its handler runs."""
        self.releasing = False
        """Its handler returned: its outcome is on its way to the store."""
        self.outcome: outcomes.Outcome | None = None
        self.given_up = False
        """Cancelled or its lease lost: its handler is cancelled (or never runs), nothing is released."""


class HandlerContext:
    """What a handler that takes a second argument gets: the item's queue and a way to make children.

    ```python
    @app.queue("orders")
    async def order(item, ctx):
        if not await ctx.children("payment"):
            await ctx.create_child("payment", data={"amount": item.data["total"]}, queue="payments")
            return Wait()                       # woken when the payment finishes
        return "paid"
    ```
    """

    def __init__(self, runner: QueueRunner, item: Interaction, loop: asyncio.AbstractEventLoop) -> None:
        self._runner = runner
        self._loop = loop
        self.item = item
        self.queue = runner.name
        self.worker = runner.worker.id

    async def create(self, queue: str, **fields: Any) -> answers.Interaction:
        """Create an interaction in any queue (fields as in the HTTP create, ``due_at`` in epoch ms); answers
        it as the clients and the producer do."""
        return cast(answers.Interaction, await self._runner.source.create(queue, fields))

    async def create_child(self, name: str, queue: str | None = None, **fields: Any) -> answers.Interaction:
        """Create a child of the item being handled (in this queue unless ``queue`` says otherwise)."""
        return await self.create(queue or self.queue, parent_id=int(self.item.id), name=name, **fields)

    async def children(self, name: str | None = None) -> list[answers.Interaction]:
        """The item's children (with ``name``), oldest first."""
        return cast(list[answers.Interaction], await self._runner.source.children(self.item.id, name))

    def run(self, coroutine: Any) -> Any:
        """From a sync handler (in its thread): run one of the coroutines above and answer its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()


TRACEBACK_CHARS = 16_000


def error_detail(exc: BaseException) -> dict[str, Any]:
    """What a handler raised, as stored with the item: the type, the message and the traceback (its end,
    where the error is, when it is longer than ``TRACEBACK_CHARS``)."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(lines)
    if len(text) > TRACEBACK_CHARS:
        text = "…" + text[-TRACEBACK_CHARS:]
    module = type(exc).__module__
    name = type(exc).__qualname__ if module == "builtins" else f"{module}.{type(exc).__qualname__}"
    return {"type": name, "message": str(exc)[:2000], "traceback": text}


def _wants_context(target: Any) -> bool:
    try:
        return len(inspect.signature(target).parameters) >= 2
    except (TypeError, ValueError):
        return False


class QueueRunner:
    """Leases, runs and releases the items of one queue.

    Per item there is a record (``_InFlight``), not a task: the lease loop appends the items it took to a deque,
    and up to ``concurrency`` long-lived handler loops take them from it. A handler that returns without
    waiting for anything lets its loop take the next item in the same step of the event loop, so a batch of
    quick handlers costs a few task wake-ups, not one task each. Cancelling one item's handler (the item was
    cancelled, its lease lost, its timeout passed) cancels the loop's task while it runs that handler, and the
    loop takes the cancellation back (``Task.uncancel``) and goes on. Outcomes are gathered and stored one
    batch at a time; an item holds its place in ``inflight`` until its outcome is stored."""

    def __init__(self, worker: Worker, name: str, target: Any, options: QueueOptions) -> None:
        self.worker = worker
        self.name = name
        self.target = target
        self.options = options
        self.inflight: dict[int, _InFlight] = {}
        self._with_context = _wants_context(target)
        self._is_async = inspect.iscoroutinefunction(target)
        self._lease_ms = options.lease_ms or worker.cfg.lease_ms
        self.handled = 0
        self._timeout_ms: int | None = options.timeout_ms
        self._leasing = True
        self._slot = asyncio.Event()
        self._stop_leasing = asyncio.Event()
        self._forced = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._releasing = 0
        """Items of ``inflight`` whose outcome is on its way to the store."""
        self._queued: collections.deque[_InFlight] = collections.deque()
        self._loops: set[asyncio.Task[None]] = set()
        self._idle: list[asyncio.Future[None]] = []
        """One future per handler loop waiting for an item (the last to wait is woken first)."""
        self._waking = 0
        """Handler loops woken (or made) that have not yet looked at the deque."""
        self._outcomes: list[_InFlight] = []
        """Items whose outcome is to be stored, in the order their handlers returned."""
        self._outcome_ready = asyncio.Event()
        self._lease_soon = False
        """The lease loop waits for slots to free and will lease as soon as they do: it then sends the outcomes
        waiting with that lease (one call), so the release loop leaves them to it for a moment."""
        self._tasks: list[asyncio.Task[None]] = []
        # Handler loops start from the context the runner was made in, whichever loop or handler makes them.
        self._context = contextvars.copy_context()
        self.stopped = asyncio.Event()

    @property
    def source(self) -> QueueSource:
        return self.worker.source

    def start(self) -> None:
        self._tasks = [  # the lease loop first: a stop waits for it
            asyncio.create_task(self._lease_loop(), name=f"interactions:{self.name}:lease"),
            asyncio.create_task(self._release_loop(), name=f"interactions:{self.name}:release"),
            asyncio.create_task(self._keep_leases(), name=f"interactions:{self.name}:keeper"),
        ]

    # --- leasing -------------------------------------------------------------------------------

    async def _lease_loop(self) -> None:
        poll_s = self.worker.poll_ms / 1000
        failures = 0
        busy = False
        while self._leasing:
            free = self._free_slots()
            if free <= 0 or (busy and free < min(self.options.batch, self.options.concurrency) // 2):
                # While the queue is busy, lease in large batches rather than one freed slot at a time.
                self._slot.clear()
                self._lease_soon = self.source.releases_with_lease(self.name)
                await self._until(self._slot.wait(), None if free <= 0 else 0.005)
                continue
            self._lease_soon = False
            waiter = self.source.waiter(queue_channel(self.name))
            sending: list[_InFlight] = []
            if self._outcomes and self.source.releases_with_lease(self.name):
                sending, self._outcomes = self._outcomes[:RELEASE_BATCH], self._outcomes[RELEASE_BATCH:]
            try:
                room = min(free, self.options.batch)
                if sending:
                    releases = [(e.id, e.token, e.outcome) for e in sending if e.outcome is not None]
                    held, leased = await self.source.release_and_lease(self.name, self.worker.id, releases, room, self.options.lease_ms)
                    self._released(sending, held)
                else:
                    leased = await self.source.lease(self.name, self.worker.id, room, self.options.lease_ms)
                failures = 0
            except Exception as exc:
                if sending and sending[0].id in self.inflight:
                    # Not stored (or not known to be: a release is fenced, sending it again changes nothing twice):
                    # the release loop sends them again.
                    self._outcomes[:0] = sending
                    self._outcome_ready.set()
                failures += 1
                log_failure(log, exc, "leasing from queue %s failed (attempt %d)", self.name, failures)
                await self._until(asyncio.sleep(min(poll_s, 0.05 * 2**failures)), None)
                continue
            if self.options.timeout_ms is None:
                self._timeout_ms = leased.processing_timeout_ms
            if leased.lease_ms:
                self._lease_ms = leased.lease_ms
            interaction = self.source.interaction
            for taken in leased.items:
                self._start(interaction(taken))
            busy = len(leased.items) == min(free, self.options.batch)
            if busy or self.source.long_polls:
                continue
            timeout = min(poll_s, self.source.until_next(leased.next_due))
            await self._until(waiter.wait(timeout), timeout)
        self._lease_soon = False

    def _free_slots(self) -> int:
        """Handlers this runner may start now. A handler that has returned no longer holds a slot while its
        outcome is being stored, so the next lease overlaps the last release; outcomes still being stored are
        capped at one more concurrency's worth, so a slow store still holds leasing back."""
        running = len(self.inflight) - self._releasing
        return min(self.options.concurrency - running, 2 * self.options.concurrency - len(self.inflight))

    async def _until(self, awaitable: Any, limit_s: float | None) -> None:
        """Wait for ``awaitable`` (at most ``limit_s``), or until leasing stops."""
        waiting = asyncio.ensure_future(awaitable)
        stopping = asyncio.ensure_future(self._stop_leasing.wait())
        try:
            await asyncio.wait({waiting, stopping}, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
            stopping.cancel()

    def _start(self, item: Interaction) -> None:
        """Hand a leased item to the handler loops."""
        assert item.lease is not None
        entry = _InFlight(item, item.lease.token)
        self.inflight[entry.id] = entry
        self._drained.clear()
        self._queued.append(entry)
        if not self._waking:
            self._wake(1)

    def _wake(self, n: int) -> None:
        """Wake (or make, up to ``concurrency``) at most ``n`` handler loops, never more than the items queued
        beyond those already woken."""
        while n > 0 and len(self._queued) > self._waking:
            if self._idle:
                self._idle.pop().set_result(None)
            elif len(self._loops) < self.options.concurrency:
                task = asyncio.create_task(self._handler_loop(), name=f"interactions:{self.name}:handler", context=self._context.copy())
                self._loops.add(task)
                task.add_done_callback(self._loops.discard)
            else:
                return
            self._waking += 1
            n -= 1

    def _forget(self, entry: _InFlight) -> None:
        if self.inflight.pop(entry.id, None) is None:
            return
        if entry.releasing:
            self._releasing -= 1
        self._slot.set()
        if not self.inflight:
            self._drained.set()

    # --- handling ------------------------------------------------------------------------------

    async def _handler_loop(self) -> None:
        """Run queued items one after another until stopped; woken when items are queued and this loop waits."""
        task = asyncio.current_task()
        assert task is not None
        queued = self._queued
        loop = asyncio.get_running_loop()
        bind(queue=self.name)
        context = logs.current()
        woken = True  # a loop is made to take an item, as if woken
        while True:
            if woken:
                self._waking -= 1
            if not queued:
                wakeup: asyncio.Future[None] = loop.create_future()
                self._idle.append(wakeup)
                try:
                    await wakeup
                except asyncio.CancelledError:
                    if wakeup.done() and not wakeup.cancelled():
                        self._waking -= 1  # woken, then stopped before it looked
                    elif wakeup in self._idle:
                        self._idle.remove(wakeup)
                    raise
                woken = True
                continue
            entry = queued.popleft()
            if queued:
                # More items than this loop: a loop just woken wakes two more (so a batch of handlers that wait
                # spreads over the loops in a few steps), a busy one only keeps one wake-up on its way.
                self._wake(2 if woken else 0 if self._waking else 1)
            woken = False
            if entry.given_up:
                continue
            entry.task = task
            logs.set_current({**context, "interaction_id": entry.item.id})  # this item's log lines
            try:
                outcome = await self._handle(entry, task)
            finally:
                entry.task = None
            if outcome is None:
                self._forget(entry)
                continue
            entry.outcome = outcome
            entry.releasing = True
            self._releasing += 1
            self._outcomes.append(entry)
            self._outcome_ready.set()
            self._slot.set()

    async def _call(self, item: Interaction) -> Any:
        if self._is_async and not self._with_context:
            return await self.target(item)
        args: tuple[Any, ...] = (item,)
        if self._with_context:
            args = (item, HandlerContext(self, item, asyncio.get_running_loop()))
        if self._is_async:
            return await self.target(*args)
        result = await asyncio.to_thread(self.target, *args)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _handle(self, entry: _InFlight, task: asyncio.Task[None]) -> outcomes.Outcome | None:
        """Run the item's handler: its outcome, or None when the item was given up (cancelled, its lease
        lost) and its handler cancelled. The lease of an item given up is left to expire, so the item is
        retried elsewhere if it is still wanted."""
        item = entry.item
        timeout_ms = self._timeout_ms
        try:
            # Neither a span nor a timeout is built when tracing is off and the queue has no timeout.
            traced = (tracing.span(f"interaction {self.name}", links_to=item.trace_parent, queue=self.name,
                                   interaction_id=item.id) if tracing.enabled() else contextlib.nullcontext())
            with traced:
                if timeout_ms:
                    async with asyncio.timeout(timeout_ms / 1000):
                        value = await self._call(item)
                else:
                    value = await self._call(item)
            outcome = outcomes.as_outcome(value)
        except TimeoutError:
            outcome = outcomes.Retry(f"processing timed out after {timeout_ms} ms")
            log.warning("handler of %s #%s timed out after %s ms", self.name, entry.id, timeout_ms)
        except asyncio.CancelledError:
            # The item's own cancellation is taken back and the loop goes on; a stop's ends the loop. One the handler
            # raised itself (nothing cancelled this loop) leaves the item to its lease, as a cancellation does.
            if entry.given_up and task.uncancel() == 0:
                return None
            if task.cancelling() == 0:
                log.warning("handler of %s #%s raised CancelledError: its lease is left to expire", self.name, entry.id)
                return None
            raise
        except Exception as exc:
            outcome = self.options.outcome_of(exc)
            log.warning("handler of %s #%s raised %r (attempt %d%s)", self.name, entry.id, exc, item.attempts,
                        ": it fails" if isinstance(outcome, outcomes.Fail) else "")
        if entry.given_up:
            # The handler swallowed its cancellation and returned: the loop's task must not stay cancelling.
            task.uncancel()
        return outcome

    async def _release_loop(self) -> None:
        while True:
            await self._outcome_ready.wait()
            if self._lease_soon:
                # The lease loop is about to lease: it sends these with it. Whatever it leaves is sent after.
                await asyncio.sleep(LEASE_SOON_S)
            self._outcome_ready.clear()
            pending, self._outcomes = self._outcomes, []
            for start in range(0, len(pending), RELEASE_BATCH):
                await self._release(pending[start:start + RELEASE_BATCH])

    async def _release(self, batch: list[_InFlight]) -> None:
        """Store a batch of outcomes (one call), trying again until the store takes it; only then is each
        item forgotten (so its slot counts until its outcome is stored)."""
        for attempt in range(1, 1_000_000):
            try:
                answers = await self.source.release_many(self.name, [(e.id, e.token, e.outcome) for e in batch if e.outcome is not None])
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log_failure(log, exc, "releasing %d items of %s failed (attempt %d)", len(batch), self.name, attempt)
                await asyncio.sleep(min(5.0, 0.05 * 2**attempt))
        self._released(batch, answers)

    def _released(self, batch: list[_InFlight], answers: list[bool]) -> None:
        """The outcomes of ``batch`` are stored (``answers``: whether each lease was still held): forget them."""
        for entry, held in zip(batch, answers, strict=True):
            if not held:
                log.info("the lease on %s #%s was lost before its outcome was stored", self.name, entry.id)
            self._forget(entry)
        self.handled += len(batch)

    # --- leases of running handlers -------------------------------------------------------------

    async def _keep_leases(self) -> None:
        """Heartbeat the running items' leases; cancel the handlers of items cancelled or lost."""
        last_beat = time.monotonic()
        while True:
            # The queue's lease may change while running: beat three times per lease as it is now.
            beat_s = max(0.05, self._lease_ms / 3000)
            next_beat = last_beat + beat_s
            waiter = self.source.waiter(cancelled_channel(self.name))
            # Short naps: a lease taken meanwhile may be shorter than the one this beat was planned for.
            signalled = await waiter.wait(min(0.1, max(0.0, next_beat - time.monotonic())))
            try:
                if signalled:
                    self._cancel_lost(*await self._still_held())
                    await asyncio.sleep(0.02)
                if time.monotonic() >= next_beat:
                    last_beat = time.monotonic()
                    leases = [(i, e.token) for i, e in list(self.inflight.items()) if not e.releasing]
                    if leases:
                        kept = await self.source.heartbeat_many(leases, self._lease_ms)
                        self._cancel_lost(kept, {i for i, _ in leases})
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log_failure(log, exc, "keeping the leases of %s failed; retrying", self.name)
                await asyncio.sleep(beat_s)

    async def _still_held(self) -> tuple[set[int], set[int]]:
        """Of the running items, those whose lease is still held; and which items were checked (an item
        leased while the store was read is not among them, and must not be taken for lost)."""
        checking = {i: e.token for i, e in list(self.inflight.items()) if not e.releasing}
        if not checking:
            return set(), set()
        return await self.source.still_held(checking), set(checking)

    def _cancel_lost(self, held: set[int], checked: set[int]) -> None:
        for item_id in checked:
            entry = self.inflight.get(item_id)
            if entry is None or entry.releasing or entry.given_up or item_id in held:
                continue
            entry.given_up = True
            if entry.task is None:
                self._forget(entry)  # still queued: it never runs
                continue
            log.info("cancelling the handler of %s #%s: the item was cancelled or its lease lost", self.name, item_id)
            entry.task.cancel()

    # --- stopping ------------------------------------------------------------------------------

    async def stop(self, graceful: bool = True, timeout_ms: int | None = None) -> None:
        """Stop leasing; let running handlers finish and their outcomes be stored (at most ``timeout_ms``), or
        cancel them at once when not ``graceful``. Cancelled items keep their leases until they expire, then
        are retried."""
        self._leasing = False
        self._stop_leasing.set()
        if self.stopped.is_set():
            return
        if not graceful:
            self._forced.set()  # a graceful stop under way stops waiting as well
        loop = asyncio.get_running_loop()
        deadline = None if timeout_ms is None else loop.time() + timeout_ms / 1000
        if graceful and self._tasks:
            # A lease in flight (a long poll over HTTP) may still take items: they are run, not orphaned.
            await asyncio.wait([self._tasks[0]], timeout=None if deadline is None else max(0.0, deadline - loop.time()))
        if graceful and self.inflight:
            # Every item taken is run and its outcome stored, unless forced or out of time.
            waits = [asyncio.ensure_future(self._drained.wait()), asyncio.ensure_future(self._forced.wait())]
            try:
                await asyncio.wait(waits, timeout=None if deadline is None else max(0.0, deadline - loop.time()),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
        loops = list(self._loops)
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for entry in list(self.inflight.values()):
            self._forget(entry)  # their leases expire
        self._queued.clear()
        self.stopped.set()


class Worker:
    """Runs every queue handler of a ``mainspring.App`` registry against one store, or another source of
    items (``interactions.sources``: a server's HTTP API)."""

    def __init__(self, store: Store | QueueSource, registry: Any, cfg: InteractionsSettings | None = None, *, poll_ms: int = 1000,
                 name: str | None = None) -> None:
        self.cfg = cfg or InteractionsSettings()
        self.source: QueueSource = StoreQueues(store, self.cfg) if isinstance(store, Store) else store
        self.registry = registry
        self.poll_ms = poll_ms
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.runners: dict[str, QueueRunner] = {}

    async def start(self) -> None:
        options = {queue: QueueOptions.of(r.options) for queue, r in self.registry.queues.items()}
        configured = {queue: o.queue_settings() for queue, o in options.items() if o.queue_settings()}
        if configured:
            # The code is where a queue's handler and its retry policy are written: what @app.queue names wins over
            # what is stored (a queue a producer created first has the defaults), and the change is said.
            for queue, changes in (await self.source.apply_queue_settings(configured)).items():
                log.info("queue %s takes the settings of @app.queue: %s (the code wins for the settings it names; "
                         "PUT /v1/queues/%s sets the others)", queue, ", ".join(f"{k} {old!r} → {new!r}" for k, (old, new) in changes.items()), queue)
        for queue, registration in self.registry.queues.items():
            runner = QueueRunner(self, queue, registration.target, options[queue])
            self.runners[queue] = runner
            runner.start()
        if self.runners:
            log.info("worker %s runs queues %s", self.id, ", ".join(sorted(self.runners)))

    async def stop_queue(self, queue: str, graceful: bool = True, timeout_ms: int | None = None) -> None:
        """Stop one queue's handler and wait until it has stopped."""
        runner = self.runners.pop(queue)
        await runner.stop(graceful, timeout_ms)

    async def stop(self, graceful: bool = True, timeout_ms: int | None = None) -> None:
        """Stop every queue: gracefully (running handlers finish, bounded by ``timeout_ms``) or by force.
        Called again with ``graceful=False`` while a graceful stop runs, it cancels what still runs."""
        runners = list(self.runners.values())
        await asyncio.gather(*(r.stop(graceful, timeout_ms) for r in runners))
        for name in [n for n, r in self.runners.items() if r.stopped.is_set()]:
            del self.runners[name]
