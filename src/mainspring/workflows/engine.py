"""The workflow engine: one run's coroutine, its recorded calls, and replay.

A run's history (its machine's events) is a list of records, written in order by one server at a time:

| record | written when |
| --- | --- |
| ``{"wf": "start", "args"}`` | the run is created (event 1) |
| ``{"wf": "step", "n", "name", "result" or "error"}`` | a step's function returned (or failed its last attempt) |
| ``{"wf": "sleep", "n", "until"}`` / ``{"wf": "woke", "n"}`` | a sleep began / its timer fired |
| ``{"wf": "wait", "n", "signal", "until"}`` / ``{"wf": "took", "n", "s", "payload"}`` / ``{"wf": "timeout", "n"}`` | a wait found no signal / it took signal ``s`` / its timeout passed |
| ``{"wf": "signal", "s", "name", "payload"}`` | a signal arrived (``s``: 1, 2, … in arrival order) |
| ``{"wf": "task", "n", "queue", "item"}`` / ``{"wf": "task_done", "n", "status", …}`` | an interaction was created / it finished |
| ``{"wf": "child", "n", "name", "id"}`` / ``{"wf": "child_done", "n", "status", …}`` | a child run was started or joined / it finished |
| ``{"wf": "now" | "uuid", "n", "value"}``, ``{"wf": "patch", "n", "name"}`` | the value ``wf.now()``, ``wf.uuid()`` answered; ``wf.patched`` answered True |
| ``{"wf": "cancel"}``, ``{"wf": "retry"}``, ``{"wf": "end", "status", …}`` | cancel and retry requests; the function's end |

Every call the code makes gets the next number ``n`` when it is made. The coroutine sees the completions one at
a time, in the order they were recorded, and runs until it waits again ("settles") before it sees the next —
live as in replay — so concurrent branches (``asyncio.gather``) make their calls in the same order both times.
Live, a completion is written (and committed) before the coroutine sees it. In replay the same completions come
from the history; a call that meets another record than its own fails the run (``nondeterminism``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import traceback
import uuid as uuidlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

from mainspring.types import JsonData, JsonObject
from mainspring.workflows.errors import ChildFailed, StepFailed, TaskFailed
from mainspring.workflows.records import Record, RunAux

if TYPE_CHECKING:
    from mainspring.machines.data import MachineRow
    from mainspring.workflows.runner import Runner

T = TypeVar("T", bound=JsonData)
CallName = str | list[str] | None
"""What a call is recorded under: a step's, wait's or patch's name, a task's queue, a child's [name, id]."""

CURRENT_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("mainspring_workflow_key", default=None)

COMPLETIONS = frozenset({"step", "woke", "took", "timeout", "task_done", "child_done", "cancel"})
"""Records the coroutine waits for: each is delivered after it is written, one at a time."""
EXTERNAL = frozenset({"cancel", "retry"})
"""Records another writer than the run's server appends (the cancel and retry requests)."""
CALL_KIND = {"step": "step", "sleep": "sleep", "woke": "sleep", "wait": "wait", "took": "wait", "timeout": "wait", "task": "task",
             "task_done": "task", "child": "child", "child_done": "child", "now": "now", "uuid": "uuid", "patch": "patch"}
SETTLE_ROUNDS = 4
"""Event-loop rounds without a new call after which a coroutine is taken to wait (see ``Run.settle``)."""


class Nondeterminism(BaseException):
    """Replay met another call than the one recorded at that place (a BaseException: the workflow's own
    ``except Exception`` must not swallow it)."""


class Evicted(BaseException):
    """The run's coroutine was dropped (another server advanced the run, or memory was needed): nothing it does
    any more is recorded."""


@dataclass
class Call:
    n: int
    kind: str
    name: CallName
    future: asyncio.Future[JsonData]
    waiting: bool = False
    """Issued and waiting for something outside the server (a timer, a signal, a task, a child)."""
    until: int | None = None
    item: str | None = None
    child: tuple[str, str] | None = None
    done: bool = False
    """Its completion is recorded (or being written)."""


@dataclass
class Outcome:
    status: str
    result: JsonData = None
    error: JsonObject | None = None


class Workflow:
    """What a workflow's code is given: recorded calls, the run's ``id``, ``name`` and ``args`` (API.md §5)."""

    def __init__(self, run: Run) -> None:
        self._run = run

    @property
    def id(self) -> str:
        return self._run.run_id

    @property
    def name(self) -> str:
        return self._run.name

    @property
    def args(self) -> JsonData:
        return self._run.args

    @property
    def key(self) -> str:
        """Inside a step's function: a key unique to this call of this run, the same when it is called again."""
        key = CURRENT_KEY.get()
        if key is None:
            raise RuntimeError("wf.key is read inside a step's function")
        return key

    async def step(self, fn: Callable[..., object], *args: object, name: str | None = None, max_attempts: int = 1, backoff_ms: int = 1000,
                   **kwargs: object) -> JsonData:
        """Call ``fn`` once per run and record its JSON return value (see API.md §5)."""
        if max_attempts < 1 or backoff_ms < 0:
            raise ValueError("max_attempts must be at least 1 and backoff_ms not negative")
        run = self._run
        call, live = run.issue("step", name or getattr(fn, "__name__", "step"))
        if live:
            run.when_live(lambda: run.start_step(call, functools.partial(fn, *args, **kwargs), max_attempts, backoff_ms))
        return await call.future

    async def sleep(self, ms: int) -> None:
        """A durable sleep: a machine timer; the run is ``sleeping``."""
        run = self._run
        call, live = run.issue("sleep", None)
        if live:
            run.when_live(lambda: run.begin_sleep(call, ms))
        await call.future

    async def wait(self, signal: str, timeout_ms: int | None = None) -> JsonData:
        """The payload of the oldest signal ``signal`` not taken yet; ``TimeoutError`` after ``timeout_ms``."""
        run = self._run
        call, live = run.issue("wait", signal)
        if live:
            run.when_live(lambda: run.begin_wait(call, signal, timeout_ms))
        return await call.future

    async def child(self, name: str, id: str, args: JsonData = None) -> JsonData:
        """Start run ``id`` of workflow ``name`` (or join it) and answer its result; ``ChildFailed`` otherwise."""
        run = self._run
        call, live = run.issue("child", [name, id])
        if live:
            run.when_live(lambda: run.begin(run.runner.start_child(run, call, name, id, args)))
        return await call.future

    async def task(self, queue: str, data: JsonData = None, **fields: object) -> JsonData:
        """Create an interaction in ``queue`` once per run and answer its result; ``TaskFailed`` otherwise."""
        unknown = set(fields) - {"priority", "user", "source", "channel"}
        if unknown:
            raise TypeError(f"wf.task takes priority, user, source and channel, not {', '.join(sorted(unknown))}")
        run = self._run
        call, live = run.issue("task", queue)
        if live:
            run.when_live(lambda: run.begin(run.runner.create_task(run, call, queue, data, fields)))
        return await call.future

    def now(self) -> int:
        """The time in epoch ms, recorded on the first run and the same on replay."""
        return int(self._run.value_of("now", lambda: self._run.runner.now_ms()))

    def uuid(self) -> str:
        """A random uuid, recorded on the first run and the same on replay."""
        return str(self._run.value_of("uuid", lambda: str(uuidlib.uuid4())))

    def patched(self, change: str) -> bool:
        """True when this run reaches this call on code that has it; False in a replay of a history recorded
        before the call existed (old runs finish on the old path)."""
        return self._run.patched(change)


class Run:
    """One run in memory: its coroutine, its calls, what is to be written, and what was written."""

    def __init__(self, runner: Runner, name: str, run_id: str, fn: Callable[[Workflow, JsonData], Awaitable[object]], args: JsonData,
                 machine: MachineRow, aux: RunAux) -> None:
        self.runner = runner
        self.name = name
        self.run_id = run_id
        self.fn = fn
        self.args = args
        self.machine = machine
        self.aux = aux.copy()
        self.calls: dict[int, Call] = {}
        self.next_n = 1
        self.index: dict[int, Record] = {}
        self.replaying = False
        self.to_replay: deque[Record] = deque()
        self.deferred: list[Callable[[], None]] = []
        self.buffer: list[Record] = []
        self.delivered: list[int] = []
        self.inbox: dict[str, deque[tuple[int, JsonData]]] = {}
        self.signals = 0
        self.executing: set[asyncio.Task[None]] = set()
        self.side: set[asyncio.Future[None]] = set()
        self.cancel_requested = False
        self.cancel_delivered = False
        self.evicted = False
        self.broken: str | None = None
        self.outcome: Outcome | None = None
        self.main: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        self.progress = 0
        self.written_at = 0
        self.parked_at: int | None = None
        self.writing = False
        self.lock = asyncio.Lock()
        """Held while the run writes or reads its notifications."""
        self.redriven: MachineRow | None = None
        """The machine as the machines loop handed it over while this server still advanced the run."""
        self.workflow = Workflow(self)

    # --- what the runner asks ---------------------------------------------------------------------------------

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.run_id)

    def start(self) -> None:
        """Run the function (from its start: live, or under replay when ``to_replay`` holds its history)."""
        self.main = asyncio.create_task(self._main(), name=f"workflow {self.name}/{self.run_id}")

    def finished(self) -> bool:
        return self.outcome is not None

    def blocked(self) -> bool:
        """Nothing in this server moves the run on: no step runs, no completion is to be written or seen."""
        return not self.executing and not self.side and not any(r["wf"] in COMPLETIONS for r in self.buffer) and self.outcome is None

    def waiting_calls(self) -> list[Call]:
        return [c for c in self.calls.values() if c.waiting and not c.done]

    def deadline(self) -> int | None:
        dues = [c.until for c in self.waiting_calls() if c.until is not None]
        return min(dues) if dues else None

    def fire_timers(self, now: int) -> None:
        """Record the sleeps and waits whose time has come."""
        for call in sorted(self.waiting_calls(), key=lambda c: c.n):
            if call.until is not None and call.until <= now:
                self.append({"wf": "woke" if call.kind == "sleep" else "timeout", "n": call.n})

    def evict(self) -> None:
        """Drop the coroutine: whatever it does from now on raises ``Evicted`` and is not recorded."""
        self.evicted = True
        for task in (*self.executing, *self.side):
            task.cancel()
        for call in self.calls.values():
            if not call.future.done():
                call.future.set_exception(Evicted())
                call.future.exception()  # retrieved: never "exception was never retrieved"
        self.wake.set()

    # --- the coroutine ------------------------------------------------------------------------------------------

    async def _main(self) -> None:
        try:
            result = await self.fn(self.workflow, self.args)
            json.dumps(result, allow_nan=False)
            outcome = Outcome("completed", cast(JsonData, result))  # JSON: json.dumps took it
        except asyncio.CancelledError:
            if not self.cancel_requested or self.evicted:
                outcome = Outcome("evicted")
            else:
                outcome = Outcome("cancelled")
        except Evicted:
            outcome = Outcome("evicted")
        except Nondeterminism as exc:
            outcome = Outcome("failed", error={"type": "nondeterminism", "message": str(exc), "traceback": None})
        except Exception as exc:
            outcome = Outcome("failed", error={"type": type(exc).__name__, "message": str(exc),
                                               "traceback": "".join(traceback.format_exception(exc))[-20_000:]})
        if self.broken is not None and outcome.status != "evicted":
            outcome = Outcome("failed", error={"type": "nondeterminism", "message": self.broken, "traceback": None})
        if self.cancel_requested and outcome.status in ("completed", "failed") and outcome.error is None:
            outcome = Outcome("cancelled", outcome.result)
        self.outcome = outcome
        self.progress += 1
        self.wake.set()

    async def settle(self) -> None:
        """Let the coroutine run until it waits again: event-loop rounds until ``SETTLE_ROUNDS`` pass in a row in
        which it made no call (each resolved future wakes its awaiter a round later, a gather a round after)."""
        quiet = 0
        while quiet < SETTLE_ROUNDS:
            before = self.progress
            await asyncio.sleep(0)
            quiet = quiet + 1 if self.progress == before else 0

    # --- calls ----------------------------------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self.evicted:
            raise Evicted()
        if self.broken is not None:
            raise Nondeterminism(self.broken)

    def issue(self, kind: str, name: CallName) -> tuple[Call, bool]:
        """Number a new call; answers it and whether it must act (False: a record of the history answers it)."""
        self._check_alive()
        n = self.next_n
        self.next_n += 1
        self.progress += 1
        call = Call(n, kind, name, asyncio.get_running_loop().create_future())
        self.calls[n] = call
        record = self.index.get(n)
        if record is not None:
            self._match(call, record)
            return call, False
        return call, True

    def when_live(self, action: Callable[[], None]) -> None:
        """Act now, or once the replay is over for a call the history never saw."""
        if self.replaying:
            self.deferred.append(action)
        else:
            action()

    def _match(self, call: Call, record: Record) -> None:
        recorded_kind = CALL_KIND.get(record["wf"])
        recorded_name = self._recorded_name(record)
        if recorded_kind != call.kind or (call.kind not in ("sleep", "now", "uuid") and recorded_name != call.name):
            self.broken = (f"call {call.n} is {call.kind} {call.name!r} in the code but {recorded_kind} {recorded_name!r} in the history: "
                           "the code changed under a running run (use wf.patched for changes)")
            raise Nondeterminism(self.broken)

    @staticmethod
    def _recorded_name(record: Record) -> object:
        kind = record["wf"]
        if kind in ("step", "patch"):
            return record.get("name")
        if kind in ("wait", "took"):
            return record.get("signal")
        if kind == "task":
            return record.get("queue")
        if kind == "child":
            return [record.get("name"), record.get("id")]
        return None

    def begin(self, effect: Awaitable[None]) -> None:
        """Start a call whose effect (creating a task, starting a child) runs before its record is written."""
        task = asyncio.ensure_future(effect)
        self.side.add(task)
        task.add_done_callback(lambda t: self._side_done(t))

    def _side_done(self, task: asyncio.Future[None]) -> None:
        self.side.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None and not self.evicted:
            # The effect failed (the store went away): this server gives the run up; it is resumed by replay.
            self.runner.give_up(self, error)
        self.wake.set()

    def start_step(self, call: Call, fn: Callable[[], object], max_attempts: int, backoff_ms: int) -> None:
        context = contextvars.copy_context()
        context.run(CURRENT_KEY.set, self.runner.key_of(self, call.n))
        task = asyncio.get_running_loop().create_task(self._step(call, fn, max_attempts, backoff_ms), context=context)
        self.executing.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self.executing.discard(t)
            error = None if t.cancelled() else t.exception()
            if error is not None and not self.evicted:
                self.runner.give_up(self, error)
            self.wake.set()

        task.add_done_callback(done)

    async def _step(self, call: Call, fn: Callable[[], object], max_attempts: int, backoff_ms: int) -> None:
        # Values recorded before this step (wf.now(), wf.uuid()) are committed before it acts on them.
        await self.runner.flushed(self)
        record: Record
        for attempt in range(1, max_attempts + 1):
            try:
                value = await self.runner.call_step(fn)
                json.dumps(value, allow_nan=False)
                record = {"wf": "step", "n": call.n, "name": cast(str, call.name), "result": cast(JsonData, value)}  # JSON: json.dumps took it
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt >= max_attempts:
                    record = {"wf": "step", "n": call.n, "name": cast(str, call.name), "error": {"type": type(exc).__name__, "message": str(exc)}}
                    break
                await self.runner.sleep_ms(backoff_ms * 2 ** (attempt - 1))
        self.append(record)

    def begin_sleep(self, call: Call, ms: int) -> None:
        until = self.runner.now_ms() + max(0, int(ms))
        self.append({"wf": "sleep", "n": call.n, "until": until})
        if ms <= 0:
            self.append({"wf": "woke", "n": call.n})

    def begin_wait(self, call: Call, signal: str, timeout_ms: int | None) -> None:
        queued = self.inbox.get(signal)
        if queued:
            s, payload = queued[0]
            self.append({"wf": "took", "n": call.n, "signal": signal, "s": s, "payload": payload})
            return
        until = None if timeout_ms is None else self.runner.now_ms() + max(0, int(timeout_ms))
        self.append({"wf": "wait", "n": call.n, "signal": signal, "until": until})

    def value_of(self, kind: str, make: Callable[[], T]) -> T:
        """``wf.now()``, ``wf.uuid()``: the recorded value, or a new one recorded now."""
        self._check_alive()
        n = self.next_n
        self.next_n += 1
        self.progress += 1
        record = self.index.get(n)
        if record is not None:
            self.calls[n] = Call(n, kind, None, asyncio.get_running_loop().create_future(), done=True)
            self._match(self.calls[n], record)
            return cast(T, record.get("value"))  # what make() gave when it was recorded
        value = make()
        self.calls[n] = Call(n, kind, None, asyncio.get_running_loop().create_future(), done=True)
        self.append({"wf": kind, "n": n, "value": value})
        return value

    def patched(self, change: str) -> bool:
        self._check_alive()
        n = self.next_n
        record = self.index.get(n)
        if record is not None:
            if record["wf"] != "patch" or record.get("name") != change:
                return False  # the history was recorded before this call existed: the old path
            self.next_n += 1
            self.calls[n] = Call(n, "patch", change, asyncio.get_running_loop().create_future(), done=True)
            return True
        if self.replaying and any(r["wf"] not in ("signal", "cancel", "retry", "end") for r in self.to_replay):
            return False
        self.next_n += 1
        self.progress += 1
        self.calls[n] = Call(n, "patch", change, asyncio.get_running_loop().create_future(), done=True)
        self.append({"wf": "patch", "n": n, "name": change})
        return True

    # --- records --------------------------------------------------------------------------------------------------

    def append(self, record: Record) -> None:
        """A record to write (live): the run's state follows it now; the coroutine sees it once written."""
        if self.evicted:
            return
        self.apply(record)
        self.buffer.append(record)
        self.progress += 1
        self.wake.set()

    def apply(self, record: Record) -> None:
        """What a record changes in the run's state (not yet what the coroutine sees)."""
        kind = record["wf"]
        call = self.calls.get(record["n"]) if "n" in record else None
        if kind in ("sleep", "wait", "task", "child") and call is not None:
            call.waiting = True
            call.until = record.get("until")
            call.item = record.get("item")
            if kind == "child":
                call.child = (record["name"], record["id"])
        elif kind in COMPLETIONS and call is not None:
            call.done = True
            call.waiting = False
            if kind == "took":
                queued = self.inbox.get(record["signal"])
                if queued:
                    self.inbox[record["signal"]] = deque(item for item in queued if item[0] != record["s"])
        elif kind == "signal":
            self.signals = max(self.signals, record["s"])
            self.inbox.setdefault(record["name"], deque()).append((record["s"], record.get("payload")))
        elif kind == "cancel":
            self.cancel_requested = True

    def see(self, record: Record) -> None:
        """Let the coroutine see a written record: resolve the future of its call, or cancel the run."""
        kind = record["wf"]
        if kind == "cancel":
            self._deliver_cancel()
            return
        if kind not in COMPLETIONS:
            return
        call = self.calls.get(record["n"])
        if call is None:
            self.broken = f"the history records {kind} {record['n']} where the code made no call {record['n']}"
            self._break()
            return
        if call.future.done():
            return
        if kind == "step":
            if "error" in record:
                error = cast(dict[str, str], record["error"])  # a step's error: its type and message
                call.future.set_exception(StepFailed(error["type"], error["message"]))
            else:
                call.future.set_result(record.get("result"))
        elif kind == "woke":
            call.future.set_result(None)
        elif kind == "took":
            call.future.set_result(record.get("payload"))
        elif kind == "timeout":
            call.future.set_exception(TimeoutError(f"no signal {call.name!r} came in time"))
        elif kind == "task_done":
            if record["status"] == "completed":
                call.future.set_result(record.get("result"))
            else:
                call.future.set_exception(TaskFailed(cast(str | None, record.get("error")), record["status"]))  # a task's error: text
        elif kind == "child_done":
            if record["status"] == "completed":
                call.future.set_result(record.get("result"))
            else:
                failed = cast(dict[str, str], record.get("error") or {"type": record["status"], "message": f"the child run was {record['status']}"})
                call.future.set_exception(ChildFailed(failed.get("type", "failed"), failed.get("message", "")))
        self.progress += 1

    def _break(self) -> None:
        """Stop the coroutine: the history and the code disagree."""
        if self.main is not None and not self.main.done():
            self.main.cancel()
        for call in self.calls.values():
            if not call.future.done():
                call.future.set_exception(Nondeterminism(self.broken or "nondeterminism"))
                call.future.exception()

    def _deliver_cancel(self) -> None:
        if self.cancel_delivered:
            return
        self.cancel_delivered = True
        for task in list(self.executing):
            task.cancel()
        if self.main is not None and not self.main.done():
            self.main.cancel()
        if not self.replaying:
            self.runner.cancel_outside(self)

    def accept(self, args: JsonData) -> bool:
        """A notification for the run (a signal, a task's or a child's end, a new watcher); False: not yet (the call
        it answers is not recorded yet), keep it."""
        if not isinstance(args, dict):
            return True
        if "signal" in args:
            s = self.signals + 1
            self.append({"wf": "signal", "s": s, "name": cast(str, args["signal"]), "payload": args.get("payload")})
            for call in sorted(self.waiting_calls(), key=lambda c: c.n):
                if call.kind == "wait" and call.name == args["signal"]:
                    self.append({"wf": "took", "n": call.n, "signal": cast(str, call.name), "s": s, "payload": args.get("payload")})
                    break
            return True
        for kind in ("task", "child"):
            if kind in args:
                answered = self.calls.get(cast(int, args[kind]))
                if self.outcome is not None or (answered is not None and (answered.kind != kind or answered.done)):
                    return True  # the run ended, or a repeat: nothing to do
                if answered is None or not answered.waiting:
                    return False  # its call is not recorded yet: kept for later
                self.append({"wf": f"{kind}_done", "n": answered.n, "status": cast(str, args.get("status")), "result": args.get("result"),
                             "error": args.get("error")})
                return True
        if "watch" in args:
            watchers = self.aux.setdefault("watchers", [])
            if args["watch"] not in watchers:
                watchers.append(args["watch"])
            return True
        return True

    # --- replay ---------------------------------------------------------------------------------------------------

    def load(self, records: list[Record]) -> None:
        """Prepare a replay of ``records`` (the history after the start)."""
        self.replaying = True
        for record in records:
            if "n" in record and record["wf"] in CALL_KIND and record["n"] not in self.index:
                self.index[record["n"]] = record
        self.to_replay = deque(records)

    async def replay(self) -> None:
        """Re-run the function through its history: each record is seen as it was live, in order."""
        await self.settle()
        while self.to_replay and self.outcome is None and self.broken is None:
            record = self.to_replay.popleft()
            self.apply(record)
            self.see(record)
            await self.settle()
        self.replaying = False
        self.to_replay.clear()
        if self.broken is None and self.outcome is None:
            missing = sorted(n for n, r in self.index.items() if n not in self.calls)
            if missing:
                first = self.index[missing[0]]
                self.broken = f"the history records {first['wf']} {missing[0]} but the code made no such call"
                self._break()
        if self.broken is not None:
            self._break()
            await self.settle()
        deferred, self.deferred = self.deferred, []
        for act in deferred:
            act()
        # A cancel met in the replay ended the coroutine there (without compensation it is over already): what
        # it left unfinished outside — tasks, children — is cancelled all the same.
        if self.cancel_requested and (self.outcome is None or self.outcome.status == "cancelled"):
            self.runner.cancel_outside(self)

    # --- the status the run shows -------------------------------------------------------------------------------------

    def status(self) -> tuple[str, JsonObject | None]:
        """``running``/``sleeping``/``waiting`` and what it waits for (while not finished)."""
        if not self.blocked():
            return "running", None
        waiting = sorted(self.waiting_calls(), key=lambda c: c.n)
        if not waiting:
            return "waiting", None
        first = next((c for c in waiting if c.kind != "sleep"), waiting[0])
        if first.kind == "sleep":
            return "sleeping", {"until": first.until}
        if first.kind == "wait":
            return "waiting", {"signal": cast(str, first.name)}
        if first.kind == "task":
            return "waiting", {"task": first.item}
        return "waiting", {"child": first.child[1] if first.child else None}


__all__ = ["COMPLETIONS", "EXTERNAL", "Call", "Evicted", "Nondeterminism", "Outcome", "Run", "Workflow"]
