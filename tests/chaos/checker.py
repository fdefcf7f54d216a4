"""Checks DESIGN.md's invariants from a history and the final state the run read back.

The checker is pure: it takes the operations (``history.Op``) and a ``FinalState`` (plain data, read from the
ERP database, the API and the event log after the run), and answers the violations. That keeps it testable
in milliseconds with planted bugs (tests/chaos/test_checker.py).

What each face promises (``ok``: the client got a 2xx; ``unknown``: no answer, so either is allowed):
- exchange: a stored message's effect is in the ERP database exactly once, or the message is still
  available; an unknown store has at most one effect; nothing has an effect that was never stored.
- machines: history ids are 1..n without a gap; an ok Call/Notify key's event is there exactly once, an
  unknown one at most once, a refused one never; each timer (numbered by the processor) fired once, in order.
- interactions: an ok creation exists and is completed exactly once (one ``interaction.completed`` event,
  at most one ok complete in the history); no owner holds more leases at once than its per-owner concurrency
  (a lease released with a 2xx was held from its answer to its release request, which the server counted).
- batching: an accepted task is in exactly one completed package and is ``done``; no task is in two completed
  packages, whatever its submit was answered (or not); no package is completed twice; no task in a package was
  never submitted; a task answered ``rejected`` (a duplicate content) is in no package.
- workflows: an ok start's run exists, a refused one does not; per step of a run (its place in the body), its
  function ran at most twice, with the same ``wf.key`` each time; every record answers a call that happened; a
  completed run's result is its records' results in order; a recorded step is never called again by a server
  that could know its record: neither by the server that recorded it (its own later call) nor by a server
  process that started after the record was surely committed (once the recorder called the next step). A step
  called again by a server that held the run at the same time — the recorder had lost its lease to it, killed,
  paused, starved or clock-jumped — is allowed: the version fence keeps one record, and the key is the same.
- never stuck (``drained``: faults stopped and the quiet period passed): no message still available, no
  process undecided, every timer fired, no machine failed, every interaction and task finished.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.history import FAIL, OK, UNKNOWN, Op

EXCHANGE_OPEN_STATES = frozenset({"STARTED", "READY_TO_COMMIT", "IN_DOUBT", "CLEANUP"})
TASK_OPEN_STATES = frozenset({"pending", "packed", "claimed"})


@dataclass
class Violation:
    face: str
    invariant: str
    key: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.face}] {self.invariant} {self.key}: {self.detail}"


@dataclass
class FinalState:
    """What the run read back once the workloads stopped."""

    drained: bool = True
    # exchange
    exchange_effects: dict[str, int] = field(default_factory=dict)
    """message id → rows its effect left in the ERP database(s)."""
    exchange_available: set[str] = field(default_factory=set)
    exchange_open_processes: list[dict[str, Any]] = field(default_factory=list)
    # machines
    machines: dict[str, dict[str, Any]] = field(default_factory=dict)
    """machine id → {"status", "history": [{"id", "data"}]}."""
    timers_per_machine: int = 0
    # interactions
    interactions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """message_id (the client's key) → {"id", "status"}."""
    interaction_completed_events: dict[str, int] = field(default_factory=dict)
    """interaction id → number of ``interaction.completed`` events."""
    interaction_leases_held: list[tuple[str, float, float]] = field(default_factory=list)
    """(owner, lease answered, release sent) of each lease released with a 2xx: held all that time."""
    interaction_owner_concurrency: int | None = None
    """The chaos queue's per-owner concurrency."""
    # batching
    batch_tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """task id → {"status", "package_id"}."""
    batch_packages: dict[str, dict[str, Any]] = field(default_factory=dict)
    """package id → {"status", "task_ids"}."""
    # workflows
    workflow_runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """run id → {"status", "result", "error", "steps": the run's timeline (API.md §5)}."""
    workflow_calls: list[dict[str, Any]] = field(default_factory=list)
    """Every call of a step's function, in the order they happened: {"run", "place", "key", "token", "pid", "at"}."""
    workflow_processes: dict[int, float] = field(default_factory=dict)
    """Server process id → when it started (the true time, as the calls' ``at``)."""
    workflow_steps: int = 0
    """Steps each run makes (``act1`` … ``actN``; the place is the number)."""


def _outcomes(ops: list[Op], face: str, kind: str) -> dict[str, set[str]]:
    """key → the outcomes its attempts got."""
    found: dict[str, set[str]] = defaultdict(set)
    for op in ops:
        if op.face == face and op.kind == kind:
            found[op.key].add(op.outcome)
    return found


def _verdict(outcomes: set[str]) -> str:
    """One key's operation, over all its attempts: ok if any attempt said so, else unknown if any got no answer."""
    if OK in outcomes:
        return OK
    if UNKNOWN in outcomes:
        return UNKNOWN
    return FAIL


def check_exchange(ops: list[Op], final: FinalState) -> list[Violation]:
    found: list[Violation] = []
    stored = {key: _verdict(o) for key, o in _outcomes(ops, "exchange", "store").items()}
    for key, verdict in stored.items():
        effects = final.exchange_effects.get(key, 0)
        available = key in final.exchange_available
        if effects > 1:
            found.append(Violation("exchange", "double_effect", key, f"effect applied {effects} times in the ERP database"))
        if effects and available:
            found.append(Violation("exchange", "committed_and_available", key, "its effect is in the ERP database and it is still available"))
        if verdict == OK and effects == 0 and not available:
            found.append(Violation("exchange", "lost", key, "stored (2xx) but neither applied nor available"))
        if verdict == FAIL and effects:
            found.append(Violation("exchange", "refused_but_applied", key, "the store was refused yet its effect exists"))
        if final.drained and available:
            found.append(Violation("exchange", "stuck", key, "still available after the quiet period"))
    for key, effects in final.exchange_effects.items():
        if key not in stored and effects:
            found.append(Violation("exchange", "invented", key, "an effect for a message nobody stored"))
    if final.drained:
        for process in final.exchange_open_processes:
            found.append(Violation("exchange", "stuck", str(process.get("id")), f"process still {process.get('state')} after the quiet period"))
    return found


def _event_keys(history: list[dict[str, Any]], kind: str) -> Counter[Any]:
    return Counter(e["data"][kind] for e in history if isinstance(e.get("data"), dict) and kind in e["data"])


def check_machines(ops: list[Op], final: FinalState) -> list[Violation]:
    found: list[Violation] = []
    started = {key: _verdict(o) for key, o in _outcomes(ops, "machines", "start").items()}
    calls_by_machine: dict[str, dict[str, str]] = defaultdict(dict)
    for kind in ("call", "notify"):
        keyed: dict[str, set[str]] = defaultdict(set)
        machine_of: dict[str, str] = {}
        for op in ops:
            if op.face == "machines" and op.kind == kind:
                keyed[op.key].add(op.outcome)
                machine_of[op.key] = str(op.value.get("machine"))
        for key, outcomes in keyed.items():
            calls_by_machine[machine_of[key]][f"{kind}:{key}"] = _verdict(outcomes)
    for machine_id, verdict in started.items():
        machine = final.machines.get(machine_id)
        if machine is None:
            if verdict == OK:
                found.append(Violation("machines", "lost", machine_id, "started (201) but not found"))
            continue
        history = machine.get("history") or []
        ids = [e["id"] for e in history]
        if ids != list(range(1, len(ids) + 1)):
            found.append(Violation("machines", "history_gap", machine_id, f"history ids are not 1..{len(ids)}: {_first_break(ids)}"))
        for kind in ("call", "notify"):
            seen = _event_keys(history, kind)
            expected = {k.split(":", 1)[1]: v for k, v in calls_by_machine.get(machine_id, {}).items() if k.startswith(kind + ":")}
            for key, verdict_ in expected.items():
                count = seen.get(key, 0)
                if count > 1:
                    found.append(Violation("machines", "double_event", f"{machine_id}/{key}", f"{kind} event appended {count} times"))
                if verdict_ == OK and count == 0 and (kind == "call" or final.drained):
                    found.append(Violation("machines", "lost", f"{machine_id}/{key}", f"acknowledged {kind} has no event"))
                if verdict_ == FAIL and count:
                    found.append(Violation("machines", "refused_but_applied", f"{machine_id}/{key}", f"refused {kind} has an event"))
            for key in seen:
                if key not in expected:
                    found.append(Violation("machines", "invented", f"{machine_id}/{key}", f"a {kind} event nobody sent"))
        timers = [e["data"]["timer"] for e in history if isinstance(e.get("data"), dict) and "timer" in e["data"]]
        if timers != list(range(1, len(timers) + 1)):
            found.append(Violation("machines", "timer_fired_twice" if len(set(timers)) < len(timers) else "timer_out_of_order",
                                   machine_id, f"timer events {timers}"))
        if final.drained:
            if machine.get("status") != "working":
                found.append(Violation("machines", "stuck", machine_id, f"status {machine.get('status')}: {machine.get('error')}"))
            elif len(set(timers)) < final.timers_per_machine:
                found.append(Violation("machines", "stuck", machine_id, f"{len(set(timers))} of {final.timers_per_machine} timers fired"))
    for machine_id in final.machines:
        if machine_id not in started:
            found.append(Violation("machines", "invented", machine_id, "a machine nobody started"))
    return found


def _first_break(ids: list[int]) -> str:
    for expected, got in enumerate(ids, 1):
        if got != expected:
            return f"expected {expected}, found {got}"
    return "?"


def check_interactions(ops: list[Op], final: FinalState) -> list[Violation]:
    found: list[Violation] = []
    created = {key: _verdict(o) for key, o in _outcomes(ops, "interactions", "create").items()}
    completes = Counter(op.key for op in ops if op.face == "interactions" and op.kind == "complete" and op.outcome == OK)
    for key, verdict in created.items():
        item = final.interactions.get(key)
        if item is None:
            if verdict == OK:
                found.append(Violation("interactions", "lost", key, "created (2xx) but not found"))
            continue
        if verdict == FAIL:
            found.append(Violation("interactions", "refused_but_created", key, "the creation was refused yet it exists"))
        events = final.interaction_completed_events.get(item["id"], 0)
        if events > 1 or completes.get(item["id"], 0) > 1:
            found.append(Violation("interactions", "completed_twice", key,
                                   f"{events} completed events, {completes.get(item['id'], 0)} acknowledged completes"))
        if item["status"] == "completed" and events == 0:
            found.append(Violation("interactions", "event_lost", key, "completed without an interaction.completed event"))
        if final.drained and item["status"] != "completed":
            found.append(Violation("interactions", "stuck", key, f"status {item['status']} after the quiet period"))
    for key in final.interactions:
        if key not in created:
            found.append(Violation("interactions", "invented", key, "an interaction nobody created"))
    limit = final.interaction_owner_concurrency
    if limit is not None:
        by_owner: dict[str, list[tuple[float, float]]] = {}
        for owner, start, end in final.interaction_leases_held:
            by_owner.setdefault(owner, []).append((start, end))
        for owner, spans in sorted(by_owner.items()):
            most = most_at_once(spans)
            if most > limit:
                found.append(Violation("interactions", "limit_exceeded", owner or "(none)", f"{most} leases held at once, per_owner concurrency {limit}"))
    return found


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans [start, end) open at one moment (an end at t comes before a start at t)."""
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = running = 0
    for _, step in points:
        running += step
        most = max(most, running)
    return most


def check_batching(ops: list[Op], final: FinalState) -> list[Violation]:
    found: list[Violation] = []
    submitted = _outcomes(ops, "batching", "submit")
    answered_ok = [op for op in ops if op.face == "batching" and op.kind == "submit" and op.outcome == OK]
    accepted = {op.key for op in answered_ok if op.value.get("status") != "rejected"}
    rejected = {op.key for op in answered_ok if op.value.get("status") == "rejected"}
    acknowledged: Counter[str] = Counter()
    completed_packages: Counter[str] = Counter()
    for op in ops:
        if op.face == "batching" and op.kind == "complete" and op.outcome == OK:
            completed_packages[op.key] += 1
            acknowledged.update(op.value.get("task_ids") or [])
    for package_id, count in completed_packages.items():
        if count > 1:
            found.append(Violation("batching", "package_completed_twice", package_id, f"{count} acknowledged completes"))
    in_done: Counter[str] = Counter()
    for package in final.batch_packages.values():
        if package.get("status") == "done":
            in_done.update(package.get("task_ids") or [])
    for task_id in sorted(set(in_done) | set(acknowledged)):
        if task_id not in submitted:
            found.append(Violation("batching", "invented", task_id, "a packaged task nobody submitted"))
        # Any task, accepted or not known to be: a submit that got no answer may have been accepted, never twice.
        if in_done.get(task_id, 0) > 1 or acknowledged.get(task_id, 0) > 1:
            found.append(Violation("batching", "double_package", task_id,
                                   f"in {in_done.get(task_id, 0)} completed packages, {acknowledged.get(task_id, 0)} acknowledged completes"))
        if task_id in rejected:
            found.append(Violation("batching", "rejected_but_packaged", task_id, "answered rejected, yet in a completed package"))
    for task_id in accepted:
        count = in_done.get(task_id, 0)
        task = final.batch_tasks.get(task_id)
        if task is None:
            found.append(Violation("batching", "lost", task_id, "accepted (202) but not found"))
            continue
        if task.get("status") == "done" and count == 0:
            found.append(Violation("batching", "done_without_package", task_id, "done but in no completed package"))
        if final.drained and (task.get("status") != "done" or count == 0):
            found.append(Violation("batching", "stuck", task_id, f"status {task.get('status')}, in {count} completed packages"))
    return found


def _could_know(call: dict[str, Any], recorded: dict[str, Any], next_call_at: float | None, started: dict[int, float]) -> bool:
    """Whether the server making ``call`` could have read the record of ``recorded``: it made that call itself, or
    it started after the recorder went on to the next step (which it does only once the record is committed)."""
    if call.get("pid") == recorded.get("pid"):
        return True
    began = started.get(int(call.get("pid") or 0))
    return next_call_at is not None and began is not None and began > next_call_at


def check_workflows(ops: list[Op], final: FinalState) -> list[Violation]:
    found: list[Violation] = []
    started = {key: _verdict(o) for key, o in _outcomes(ops, "workflows", "start").items()}
    calls: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for call in final.workflow_calls:
        calls[(str(call["run"]), int(call["place"]))].append(call)
    for run_id, verdict in started.items():
        run = final.workflow_runs.get(run_id)
        if run is None:
            if verdict == OK:
                found.append(Violation("workflows", "lost", run_id, "started (2xx) but not found"))
            continue
        if verdict == FAIL:
            found.append(Violation("workflows", "refused_but_started", run_id, "the start was refused yet the run exists"))
        records = {int(s["name"].removeprefix("act")): s for s in run.get("steps") or []
                   if s.get("kind") == "step" and str(s.get("name", "")).startswith("act")}
        for place in sorted(set(records) | {p for r, p in calls if r == run_id}):
            key = f"{run_id}/act{place}"
            made = calls.get((run_id, place), [])
            if len(made) > 2:
                found.append(Violation("workflows", "step_ran_more_than_twice", key, f"its function ran {len(made)} times"))
            if len({c["key"] for c in made}) > 1:
                found.append(Violation("workflows", "key_changed", key, f"wf.key differed between calls: {sorted({str(c['key']) for c in made})}"))
            record = records.get(place)
            if record is None:
                continue
            tokens = [c["token"] for c in made]
            if record.get("result") not in tokens:
                found.append(Violation("workflows", "record_without_call", key, f"recorded result {record.get('result')!r} from no call"))
            else:
                recorded = made[tokens.index(record.get("result"))]
                after = [c for c in calls.get((run_id, place + 1), []) if c.get("pid") == recorded.get("pid")
                         and float(c.get("at") or 0) >= float(recorded.get("at") or 0)]
                next_call_at = min((float(c.get("at") or 0) for c in after), default=None)
                later = [c for c in made[tokens.index(record.get("result")) + 1:]
                         if _could_know(c, recorded, next_call_at, final.workflow_processes)]
                if later:
                    found.append(Violation("workflows", "recorded_step_ran_again", key,
                                           f"called {len(later)} more times after the call it recorded, by a server that could know the record"))
        if run.get("status") == "completed":
            expected = [records[p].get("result") if p in records else None for p in range(1, final.workflow_steps + 1)]
            if run.get("result") != expected:
                found.append(Violation("workflows", "result_mismatch", run_id, f"result {run.get('result')!r}, records {expected!r}"))
        if final.drained and run.get("status") != "completed":
            found.append(Violation("workflows", "stuck", run_id, f"status {run.get('status')}: {run.get('error')}"))
    for run_id in final.workflow_runs:
        if run_id not in started:
            found.append(Violation("workflows", "invented", run_id, "a run nobody started"))
    for run_id, place in calls:
        if run_id not in final.workflow_runs:
            found.append(Violation("workflows", "invented", f"{run_id}/act{place}", "a step call of a run that does not exist"))
    return found


def check(ops: list[Op], final: FinalState) -> list[Violation]:
    """Every violation of DESIGN.md's invariants this history and final state show."""
    return [*check_exchange(ops, final), *check_machines(ops, final), *check_interactions(ops, final), *check_batching(ops, final),
            *check_workflows(ops, final)]


__all__ = ["FAIL", "OK", "UNKNOWN", "FinalState", "Violation", "check"]
