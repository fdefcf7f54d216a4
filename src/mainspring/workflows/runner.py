"""The runs a server advances: one ``Runner`` per server (in ``Context.extras``).

A run this server advances holds its machine's lease (renewed by each write and, while a long step runs, by
``heartbeat``). Its coroutine stays in memory from one record to the next; when the run sleeps or waits its
lease is given back and the coroutine is kept (``parked``) for ``workflows.keep_ms``, at most ``keep_max`` of
them, so that waking it needs no replay. What wakes it is the machines face's own loop: a due timer, a pending
notification (a signal, a task's or a child's end) or a lapsed lease makes the machine due, the loop leases it
on some server and hands it to ``drive`` (``machines.processor.Driver``). There, a parked coroutine at the same
version goes on; anything else — another server, a restart, an eviction — replays the history first.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import cast

from mainspring.core.leases import new_token
from mainspring.core.runtime import Context, log_failure, retry_while_unavailable, run_loop
from mainspring.interactions import service as interactions
from mainspring.interactions.errors import InteractionFinished, InteractionNotFound
from mainspring.machines import driven
from mainspring.machines.data import MachineRow
from mainspring.types import JsonData, JsonObject
from mainspring.workflows import records
from mainspring.workflows.engine import COMPLETIONS, EXTERNAL, Call, Evicted, Run, Workflow

log = logging.getLogger("mainspring.workflows")

RUNNER = "workflows:runner"
INPUTS = "workflows:inputs"
"""Woken when a run may have new input (a signal, a cancel, a task's end): active runs look for theirs."""
FINISHED = "workflows:finished"
"""Woken when a run finishes (readers with ``wait_ms``)."""


def runner_of(ctx: Context) -> Runner:
    runner = ctx.extras.get(RUNNER)
    if runner is None:
        runner = ctx.extras[RUNNER] = Runner(ctx)
    return runner  # type: ignore[no-any-return]


class Runner:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.settings = ctx.settings.workflows
        self.active: dict[int, Run] = {}
        self.parked: collections.OrderedDict[int, Run] = collections.OrderedDict()
        self.tasks: set[asyncio.Task[object]] = set()

    # --- what the engine asks ---------------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return self.store.now_ms()

    async def sleep_ms(self, ms: int) -> None:
        """Sleep on the store's clock (a manual clock in tests wakes every waiter when moved)."""
        until = self.now_ms() + ms
        while not self.ctx.stopping.is_set():
            left = until - self.now_ms()
            if left <= 0:
                return
            await self.store.notifier.waiter("workflows-clock").wait(left / 1000)

    @staticmethod
    async def call_step(fn: Callable[[], object]) -> object:
        """A step's function: awaited when async, in a thread when it is a plain function."""
        target = getattr(fn, "func", fn)
        if inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(type(target).__call__):
            return await cast(Awaitable[object], fn())  # a coroutine function's call
        value = await asyncio.to_thread(fn)
        return await value if inspect.isawaitable(value) else value

    def key_of(self, run: Run, n: int) -> str:
        return f"wf:{run.name}:{run.run_id}:{n}"

    async def flushed(self, run: Run) -> None:
        """Until what the run recorded so far is written."""
        while run.buffer and not run.evicted:
            run.wake.set()
            await asyncio.sleep(0.001)

    def give_up(self, run: Run, error: BaseException) -> None:
        """Something of the run failed on this server (the store went away): drop it; its lease runs out and the
        run is resumed by replay, here or elsewhere."""
        log_failure(log, error, "run %s/%s stopped on this server; it resumes from its records", run.name, run.run_id)
        self._forget(run)

    async def create_task(self, run: Run, call: Call, queue: str, data: JsonData, fields: dict[str, object]) -> None:
        """``wf.task``: the interaction first (idempotent by its message id), then the record that names it."""
        spec = {"data": data, "message_id": records.task_message_id(run.name, run.run_id, run.machine.uid, call.n), **fields}
        item, _created = await interactions.create(self.store, self.ctx.settings.interactions, queue, spec)
        run.append({"wf": "task", "n": call.n, "queue": queue, "item": item["id"]})

    async def start_child(self, run: Run, call: Call, name: str, child_id: str, args: JsonData) -> None:
        """``wf.child``: start or join the child (it tells this run when it ends), then the record."""
        from mainspring.workflows import service

        try:
            child = await service.start_or_join(self.ctx, name, child_id, args, watcher=[run.name, run.run_id, call.n])
        except service.WorkflowNotFound as exc:
            run.append({"wf": "child", "n": call.n, "name": name, "id": child_id})
            run.append({"wf": "child_done", "n": call.n, "status": "failed", "error": {"type": exc.code, "message": str(exc)}})
            return
        run.append({"wf": "child", "n": call.n, "name": name, "id": child_id})
        if child["status"] in records.FINISHED_STATUSES:
            run.append(records.child_done(call.n, child))

    def cancel_outside(self, run: Run) -> None:
        """A cancelled run's unfinished tasks and children are cancelled too (each idempotent)."""
        from mainspring.workflows import service

        async def cancel_all() -> None:
            for call in list(run.calls.values()):
                if call.done:
                    continue
                try:
                    if call.kind == "task" and call.item is not None:
                        await interactions.cancel(self.store, call.item)
                    elif call.kind == "child" and call.child is not None:
                        await service.cancel_run(self.ctx, call.child[0], call.child[1])
                except (InteractionFinished, InteractionNotFound, service.RunFinished, service.RunNotFound):
                    pass
                except Exception as exc:
                    log_failure(log, exc, "cancelling what run %s/%s started failed", run.name, run.run_id)

        self._spawn(cancel_all())

    def _spawn(self, work: Coroutine[object, None, object]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # --- starting and resuming runs -------------------------------------------------------------------------------

    def definition(self, name: str) -> Callable[[Workflow, JsonData], Awaitable[object]] | None:
        registration = getattr(self.ctx.registry, "workflows", {}).get(name)
        return None if registration is None else registration.target  # type: ignore[no-any-return]

    def launch(self, machine: MachineRow, args: JsonData) -> None:
        """A run this server just created with its lease: start its function at once (no history to replay)."""
        fn = self.definition(machine.namespace)
        if fn is None:
            return
        run = Run(self, machine.namespace, machine.id, fn, args, machine, records.aux_of(machine))
        run.written_at = self.now_ms()
        self.active[machine.uid] = run
        run.start()
        self._advance(run)

    async def drive(self, machine: MachineRow) -> None:
        """A due run leased by the machines loop for this server."""
        uid = machine.uid
        active = self.active.get(uid)
        if active is not None:
            # This server advances it already: it was just given back (its inputs came meanwhile) or its lease had
            # lapsed. The run goes on under the loop's lease.
            active.redriven = machine
            active.wake.set()
            return
        run = self.parked.pop(uid, None)
        if run is not None and (run.machine.version != machine.version or run.evicted):
            run.evict()
            run = None
        try:
            if run is not None:
                run.machine = machine
                run.parked_at = None
            else:
                (current,) = await driven.current(self.store, [uid]) or (None,)
                if current is None:
                    return
                if current.version != machine.version:
                    if current.lease_token != machine.lease_token:
                        # Written since it was leased (this server's own write of a run it then dropped, or
                        # another's): a replay of the leased version would call a step that is recorded now. Whoever
                        # wrote last holds the run; the loop leases it again when that lease runs out.
                        return
                    machine = current  # a request appended under this lease (a cancel): load the newest
                run = await self._load(machine)
                if run is None:
                    return
            self.active[uid] = run
            run.written_at = self.now_ms()
            await self._take_inputs(run)
            run.fire_timers(self.now_ms())
        except Exception as exc:
            if run is not None:
                self._forget(run)
            log_failure(log, exc, "resuming run %s/%s failed; it is retried when its lease runs out", machine.namespace, machine.id)
            return
        self._advance(run)

    async def _load(self, machine: MachineRow) -> Run | None:
        """The run rebuilt from its history (replayed), or None when there is nothing to run (finished)."""
        history = [records.record_of(h.data) for h in await driven.history(self.store, machine)]
        aux = records.aux_of(machine)
        start: records.Record | dict[str, JsonData] = history[0] if history else {}
        fn = self.definition(machine.namespace)
        if aux.get("ended") or fn is None:
            await self._after_end(machine)
            return None
        run = Run(self, machine.namespace, machine.id, fn, start.get("args"), machine, aux)
        run.load(history[1:])
        run.start()
        await run.replay()
        return run

    async def _after_end(self, machine: MachineRow) -> None:
        """A finished run that was due: tell its watchers (again: they ignore repeats), drop its notifications."""
        aux = records.aux_of(machine).copy()
        pending = await driven.notifications(self.store, machine.uid)
        for notification in pending:
            args = notification.args if isinstance(notification.args, dict) else {}
            if "watch" in args and args["watch"] not in aux.setdefault("watchers", []):
                aux["watchers"].append(args["watch"])
        await self.notify_watchers(machine, aux)
        change = driven.Change((), records.as_json(aux), None, None, status=machine.status, error=machine.error, delivered=[n.seq for n in pending])
        await driven.apply(self.store, machine, change)

    async def notify_watchers(self, machine: MachineRow, aux: records.RunAux) -> None:
        from mainspring.workflows import service

        for watcher in aux.get("watchers") or []:
            await service.tell_watcher(self.ctx, cast(list[JsonData], watcher), {"status": aux.get("status"), "result": aux.get("result"), "error": aux.get("error")})

    async def _take_inputs(self, run: Run) -> None:
        """Read the run's pending notifications and record what they bring (never while the run writes: a
        notification read before a write deleted it would be taken twice)."""
        async with run.lock:
            taken = {*run.delivered}
            for notification in await driven.notifications(self.store, run.machine.uid):
                if notification.seq in taken:
                    continue
                if run.accept(notification.args):
                    run.delivered.append(notification.seq)

    # --- advancing a run --------------------------------------------------------------------------------------------

    def _advance(self, run: Run) -> None:
        task = asyncio.create_task(self._advance_run(run), name=f"advance {run.name}/{run.run_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _advance_run(self, run: Run) -> None:
        try:
            while not run.evicted:
                await run.settle()
                if run.evicted:
                    return
                if run.outcome is not None and run.outcome.status == "evicted":
                    self._forget(run)
                    return
                run.fire_timers(self.now_ms())
                if not run.buffer and not run.delivered and run.outcome is None and not run.blocked():
                    await self._wait_for_work(run)
                    continue
                if await self._write(run):
                    return
        except Exception as exc:
            self.give_up(run, exc)

    async def _wait_for_work(self, run: Run) -> None:
        run.wake.clear()
        if run.buffer or run.outcome is not None or run.evicted:
            return
        deadline = run.deadline()
        timeout = None if deadline is None else max(0.0, (deadline - self.now_ms()) / 1000)
        if timeout is not None:
            waiter = self.store.notifier.waiter("workflows-clock")
            clock = asyncio.ensure_future(waiter.wait(timeout))
            woken = asyncio.ensure_future(run.wake.wait())
            try:
                await asyncio.wait({clock, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                clock.cancel()
                woken.cancel()
        else:
            await run.wake.wait()

    async def _write(self, run: Run) -> bool:
        """Write what the run recorded, with its status; then let the coroutine see it. True: the run is off this
        server's hands (parked, finished or dropped)."""
        finished = run.outcome is not None
        blocked = not finished and run.blocked()
        written = list(run.buffer)
        taken = len(written)
        delivered = list(run.delivered)
        now = self.now_ms()
        aux = run.aux.copy()
        if finished:
            assert run.outcome is not None
            end: records.Record = {"wf": "end", "status": run.outcome.status}
            if run.outcome.status == "completed":
                end["result"] = run.outcome.result
            if run.outcome.error is not None:
                end["error"] = run.outcome.error
            written.append(end)
            aux.update({"status": "cancelled" if run.cancel_requested else run.outcome.status, "waiting_for": None,
                        "result": run.outcome.result if run.outcome.status == "completed" else None, "error": run.outcome.error, "ended": True,
                        "finished_at": aux.get("finished_at") if run.cancel_requested else now})
            timer, lease = (now + self.settings.lease_ms if aux.get("watchers") else None), None
        else:
            status, waiting_for = run.status()
            aux.update({"status": "cancelled" if run.cancel_requested else status, "waiting_for": waiting_for})
            if blocked:
                timer, lease = run.deadline(), None
            else:
                timer, lease = now, (run.machine.lease_token or new_token(), now + self.settings.lease_ms)
        failed = finished and aux["status"] == "failed"
        error = cast(JsonObject, aux.get("error"))  # a failed run's error is set
        change = driven.Change(records.as_json_all(written), records.as_json(aux), timer, lease, status="failed" if failed else "working",
                               error={"type": error["type"], "message": error["message"]} if failed else None,
                               delivered=delivered, announce=records.announce(run, aux) if finished else (),
                               channels=(FINISHED,) if finished else ())
        async with run.lock:
            run.writing = True
            try:
                # A store that went away (a restart, a failover) is waited for, within the run's lease, and the
                # same records written again: giving the run up would call its finished step once more on replay.
                # Written after all (only the answer was lost), the retry meets the next version and the run is
                # replayed from its records.
                outcome, machine = await retry_while_unavailable(
                    f"writing run {run.name}/{run.run_id}", lambda: driven.apply(self.store, run.machine, change), self.settings.lease_ms)
            finally:
                run.writing = False
            if outcome is driven.Applied.APPLIED:
                del run.buffer[:taken]
                run.delivered = [seq for seq in run.delivered if seq not in delivered]
                run.machine = machine
        if outcome is not driven.Applied.APPLIED:
            return not await self._rebase(run)
        run.aux = aux
        run.written_at = now
        for record in written:
            if record["wf"] in COMPLETIONS:
                run.see(record)
                await run.settle()
        if finished:
            self._forget(run)
            if aux.get("watchers"):
                await self.notify_watchers(machine, aux)
                await driven.apply(self.store, machine, driven.Change((), records.as_json(aux), None, None, status=machine.status, error=machine.error))
            return True
        handed, run.redriven = run.redriven, None
        if handed is not None and handed.version == run.machine.version:
            # Leased by the loop after this write (a notification came meanwhile): go on under its lease. One
            # leased before this write lost its lease to it, and the loop leases the run again if it is due.
            run.machine = handed
            await self._take_inputs(run)
            return False
        if blocked and not run.buffer and run.blocked():
            self._park(run)
            return True
        return False

    async def _rebase(self, run: Run) -> bool:
        """The machine moved on under the run: go on from the new version when only requests were appended (a
        cancel), else drop the coroutine (another server advanced the run). True: the run goes on here."""
        (machine,) = await driven.current(self.store, [run.machine.uid]) or (None,)
        if machine is None:
            self._forget(run)
            return False
        appended = [records.record_of(h.data) for h in await driven.history(self.store, machine, run.machine.last_event_id)]
        if machine.status != "working" or any(not isinstance(r, dict) or r.get("wf") not in EXTERNAL for r in appended):
            self._forget(run)
            return False
        run.machine = machine
        if machine.lease_token is None:
            # A parked run's lease went with the request; take it again, or leave the run to whoever has it.
            if not await driven.take(self.store, machine, new_token(), self.now_ms() + self.settings.lease_ms):
                self._forget(run)
                return False
            (run.machine,) = await driven.current(self.store, [machine.uid])
        for record in appended:
            run.apply(record)
            run.see(record)
            await run.settle()
        return True

    def _park(self, run: Run) -> None:
        self.active.pop(run.machine.uid, None)
        if self.settings.keep_max <= 0 or self.settings.keep_ms <= 0:
            run.evict()
            return
        run.parked_at = self.now_ms()
        self.parked[run.machine.uid] = run
        while len(self.parked) > self.settings.keep_max:
            _uid, oldest = self.parked.popitem(last=False)
            oldest.evict()

    def _forget(self, run: Run) -> None:
        uid = run.machine.uid
        if self.active.get(uid) is run:
            del self.active[uid]
        if self.parked.get(uid) is run:
            del self.parked[uid]
        if run.outcome is None or run.outcome.status == "evicted":
            run.evict()

    # --- the server's loop: leases of long steps, inputs of active runs, eviction --------------------------------------

    async def step(self) -> int | None:
        now = self.now_ms()
        lease_ms = self.settings.lease_ms
        stale = [(uid, run, run.machine.lease_token, run.machine.version) for uid, run in self.active.items()
                 if now - run.written_at > lease_ms // 3 and run.machine.lease_token and not run.writing]
        if stale:
            kept = await driven.extend_leases(self.store, [(uid, token, now + lease_ms) for uid, _run, token, _version in stale])  # type: ignore[misc]
            for uid, run, token, version in stale:
                if uid in kept:
                    run.written_at = now
                elif self.active.get(uid) is run and run.machine.lease_token == token and run.machine.version == version and not run.writing:
                    self._forget(run)  # taken over: another server advances it now
        if self.active:
            for machine in await driven.current(self.store, list(self.active)):
                found = self.active.get(machine.uid)
                if found is None:
                    continue
                run = found
                if run.writing:
                    continue
                if machine.version != run.machine.version and not run.buffer:
                    if await self._rebase(run):
                        run.wake.set()
                elif machine.notify_at is not None:
                    await self._take_inputs(run)
                    run.wake.set()
        keep = self.settings.keep_ms
        while self.parked:
            uid, oldest = next(iter(self.parked.items()))
            if oldest.parked_at is not None and now - oldest.parked_at < keep:
                break
            self.parked.pop(uid)
            oldest.evict()
        return now + max(50, min(lease_ms // 3, keep or lease_ms))

    async def loop(self) -> None:
        try:
            await run_loop(self.ctx, "workflows", self.step, channel=INPUTS)
        finally:
            for run in [*self.active.values(), *self.parked.values()]:
                run.evict()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)


__all__ = ["FINISHED", "INPUTS", "Evicted", "Runner", "runner_of"]
