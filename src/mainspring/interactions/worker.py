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
import contextlib
import inspect
import logging
import os
import socket
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, cast

from mainspring.client import models as answers
from mainspring.core import tracing
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


@dataclass
class _InFlight:
    item: Interaction
    token: str
    task: asyncio.Task[None] | None = None
    releasing: bool = False


@dataclass
class _Release:
    item_id: int
    token: str
    outcome: outcomes.Outcome
    done: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


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
    """Leases, runs and releases the items of one queue."""

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
        self._releases: asyncio.Queue[_Release] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
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
                await self._until(self._slot.wait(), None if free <= 0 else 0.005)
                continue
            waiter = self.source.waiter(queue_channel(self.name))
            try:
                leased = await self.source.lease(self.name, self.worker.id, min(free, self.options.batch), self.options.lease_ms)
                failures = 0
            except Exception as exc:
                failures += 1
                log_failure(log, exc, "leasing from queue %s failed (attempt %d)", self.name, failures)
                await self._until(asyncio.sleep(min(poll_s, 0.05 * 2**failures)), None)
                continue
            if self.options.timeout_ms is None:
                self._timeout_ms = leased.processing_timeout_ms
            if leased.lease_ms:
                self._lease_ms = leased.lease_ms
            for taken in leased.items:
                self._start(Interaction.model_validate(taken))
            busy = len(leased.items) == min(free, self.options.batch)
            if busy or self.source.long_polls:
                continue
            timeout = min(poll_s, self.source.until_next(leased.next_due))
            await self._until(waiter.wait(timeout), timeout)

    def _free_slots(self) -> int:
        """Handlers this runner may start now. A handler that has returned no longer holds a slot while its
        outcome is being stored, so the next lease overlaps the last release; outcomes still being stored are
        capped at one more concurrency's worth, so a slow store still holds leasing back."""
        releasing = sum(1 for e in self.inflight.values() if e.releasing)
        running = len(self.inflight) - releasing
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
        assert item.lease is not None
        entry = _InFlight(item, item.lease.token)
        self.inflight[int(item.id)] = entry
        entry.task = asyncio.create_task(self._process(entry), name=f"interactions:{self.name}:{item.id}")
        # A task cancelled before its first step never runs its ``finally``: forget the item here as well, or
        # its lease would be heartbeated for ever with nothing running.
        entry.task.add_done_callback(lambda _task, item_id=int(item.id): self._forget(item_id))

    def _forget(self, item_id: int) -> None:
        self.inflight.pop(item_id, None)
        self._slot.set()

    # --- handling ------------------------------------------------------------------------------

    async def _call(self, item: Interaction) -> Any:
        args: tuple[Any, ...] = (item,)
        if self._with_context:
            args = (item, HandlerContext(self, item, asyncio.get_running_loop()))
        if self._is_async:
            return await self.target(*args)
        result = await asyncio.to_thread(self.target, *args)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _process(self, entry: _InFlight) -> None:
        item_id = int(entry.item.id)
        bind(queue=self.name, interaction_id=entry.item.id)  # this task's log lines
        try:
            timeout_ms = self._timeout_ms
            try:
                # Neither a span nor a timeout is built when tracing is off and the queue has no timeout.
                traced = (tracing.span(f"interaction {self.name}", links_to=entry.item.trace_parent, queue=self.name,
                                       interaction_id=entry.item.id) if tracing.enabled() else contextlib.nullcontext())
                with traced:
                    if timeout_ms:
                        async with asyncio.timeout(timeout_ms / 1000):
                            value = await self._call(entry.item)
                    else:
                        value = await self._call(entry.item)
                outcome = outcomes.as_outcome(value)
            except TimeoutError:
                outcome = outcomes.Retry(f"processing timed out after {timeout_ms} ms")
                log.warning("handler of %s #%s timed out after %s ms", self.name, item_id, timeout_ms)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                outcome = self.options.outcome_of(exc)
                log.warning("handler of %s #%s raised %r (attempt %d%s)", self.name, item_id, exc, entry.item.attempts,
                            ": it fails" if isinstance(outcome, outcomes.Fail) else "")
            entry.releasing = True
            release = _Release(item_id, entry.token, outcome)
            self._releases.put_nowait(release)
            self._slot.set()
            held = await release.done
            if not held:
                log.info("the lease on %s #%s was lost before its outcome was stored", self.name, item_id)
            self.handled += 1
        except asyncio.CancelledError:
            # Cancelled: the item was cancelled, its lease lost, or the worker stops by force. The
            # lease is left to expire, so the item is retried elsewhere if it is still wanted.
            pass
        finally:
            self._forget(item_id)

    async def _release_loop(self) -> None:
        while True:
            first = await self._releases.get()
            batch = [first]
            while not self._releases.empty() and len(batch) < RELEASE_BATCH:
                batch.append(self._releases.get_nowait())
            for attempt in range(1, 1_000_000):
                try:
                    answers = await self.source.release_many(self.name, [(r.item_id, r.token, r.outcome) for r in batch])
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log_failure(log, exc, "releasing %d items of %s failed (attempt %d)", len(batch), self.name, attempt)
                    await asyncio.sleep(min(5.0, 0.05 * 2**attempt))
            for release, held in zip(batch, answers, strict=True):
                if not release.done.done():
                    release.done.set_result(held)

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
            if entry is None or entry.releasing or item_id in held:
                continue
            if entry.task is not None and not entry.task.done():
                log.info("cancelling the handler of %s #%s: the item was cancelled or its lease lost", self.name, item_id)
                entry.task.cancel()

    # --- stopping ------------------------------------------------------------------------------

    async def stop(self, graceful: bool = True, timeout_ms: int | None = None) -> None:
        """Stop leasing; let running handlers finish (at most ``timeout_ms``), or cancel them at once
        when not ``graceful``. Cancelled items keep their leases until they expire, then are retried."""
        self._leasing = False
        self._stop_leasing.set()
        if self.stopped.is_set():
            return
        loop = asyncio.get_running_loop()
        deadline = None if timeout_ms is None else loop.time() + timeout_ms / 1000
        if graceful and self._tasks:
            # A lease in flight (a long poll over HTTP) may still take items: they are run, not orphaned.
            await asyncio.wait([self._tasks[0]], timeout=None if deadline is None else max(0.0, deadline - loop.time()))
        running = [e.task for e in list(self.inflight.values()) if e.task is not None]
        if graceful and running:
            _done, pending = await asyncio.wait(running, timeout=None if deadline is None else max(0.0, deadline - loop.time()))
        else:
            pending = set(running)
        for task in pending:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        # A handler that finished waited for its outcome to be stored, so nothing is left to release.
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
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
