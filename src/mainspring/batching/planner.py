"""The batch-forming rules as a pure function: pending tasks + settings + timer state + now → what to do.

The dispatcher (``dispatcher.py``) reads the tasks really pending in the store under the batcher's lock,
asks ``plan`` and writes the answer in the same transaction, so the rules live here once, with no I/O.

A *unit* is what may travel only whole: ``group_size`` tasks of one ``group`` and one version (members
are distinct because a member holds each version once). Grouping by version keeps the two books of a pair
that changed together in one unit, and never pairs an old revision with a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PendingTask:
    seq: int
    id: str
    group: str
    member: str
    version: int | None
    created_at: int


@dataclass(frozen=True)
class Rules:
    min_size: int
    max_size: int
    linger_ms: int
    max_wait_ms: int
    group_size: int
    incomplete_group: str  # "reject" | "carry"


@dataclass(frozen=True)
class TimerState:
    linger_started_at: int | None
    linger_ends_at: int | None
    last_flush_at: int | None
    carried_through_seq: int


@dataclass
class Plan:
    packages: list[list[PendingTask]] = field(default_factory=list)
    rejected: list[PendingTask] = field(default_factory=list)
    timer: TimerState = TimerState(None, None, None, 0)
    next_due: int | None = None
    """Epoch ms at which the dispatcher must look again even if nothing arrives."""
    flushes: list[str] = field(default_factory=list)
    """Why packages were made, in order ("max_size", "linger", "max_wait"), for events and tests."""


@dataclass
class Unit:
    tasks: list[PendingTask]
    complete: bool

    @property
    def oldest(self) -> int:
        return self.tasks[0].seq


def units_of(pending: list[PendingTask], group_size: int) -> list[Unit]:
    """Split pending tasks into units, oldest first (by each unit's oldest task)."""
    buckets: dict[tuple[str, int | None], list[PendingTask]] = {}
    for task in sorted(pending, key=lambda t: t.seq):
        buckets.setdefault((task.group, task.version), []).append(task)
    units: list[Unit] = []
    for tasks in buckets.values():
        seen: list[PendingTask] = []
        for task in tasks:
            # A member twice in one bucket cannot happen through submit; if it ever does, the later one
            # waits for a unit of its own rather than making a unit with a repeated member.
            if any(t.member == task.member for t in seen):
                units.append(Unit([task], group_size == 1))
                continue
            seen.append(task)
            if len(seen) == group_size:
                units.append(Unit(seen, True))
                seen = []
        if seen:
            units.append(Unit(seen, False))
    units.sort(key=lambda u: u.oldest)
    return units


def _chunk(units: list[Unit], max_size: int) -> list[list[PendingTask]]:
    """Whole units into packages of at most ``max_size`` tasks, keeping their order."""
    packages: list[list[PendingTask]] = []
    current: list[PendingTask] = []
    for unit in units:
        if current and len(current) + len(unit.tasks) > max_size:
            packages.append(current)
            current = []
        current = current + unit.tasks
    if current:
        packages.append(current)
    return packages


def plan(pending: list[PendingTask], rules: Rules, state: TimerState, now: int) -> Plan:
    """Decide what happens to ``pending`` at ``now``."""
    result = Plan(timer=state)
    remaining = sorted(pending, key=lambda t: t.seq)
    started, ends, last_flush, carried = (
        state.linger_started_at,
        state.linger_ends_at,
        state.last_flush_at,
        state.carried_through_seq,
    )

    def take(tasks: list[PendingTask]) -> None:
        nonlocal remaining
        gone = {t.seq for t in tasks}
        remaining = [t for t in remaining if t.seq not in gone]

    # 1. The upper threshold packs the oldest complete units at once and stops the timer.
    while len(remaining) >= rules.max_size:
        package: list[PendingTask] = []
        for unit in units_of(remaining, rules.group_size):
            if unit.complete and len(package) + len(unit.tasks) <= rules.max_size:
                package.extend(unit.tasks)
        if not package:
            break
        result.packages.append(package)
        result.flushes.append("max_size")
        take(package)
        started = ends = None
        last_flush = now

    def maybe_start_timer() -> None:
        nonlocal started, ends
        if ends is not None or len(remaining) < rules.min_size:
            return
        if not any(t.seq > carried for t in remaining):
            return  # only tasks a timer already kept: nothing new can complete them, max_wait will
        # The timer starts when the count reached min_size, not when a server noticed, so it does not
        # depend on which server looks or how late.
        nth = sorted(t.created_at for t in remaining)[rules.min_size - 1]
        started = max(nth, last_flush or nth)
        ends = started + rules.linger_ms

    # 2. The lower threshold starts the linger timer; 3. its end packs complete units.
    maybe_start_timer()
    if ends is not None and now >= ends:
        units = units_of(remaining, rules.group_size)
        complete = [u for u in units if u.complete]
        for package in _chunk(complete, rules.max_size):
            result.packages.append(package)
            result.flushes.append("linger")
            take(package)
        incomplete = [t for u in units if not u.complete for t in u.tasks]
        if rules.incomplete_group == "reject":
            result.rejected.extend(incomplete)
            take(incomplete)
        carried = max([carried, *(t.seq for t in remaining)])
        started = ends = None
        last_flush = now

    # 4. No task waits past max_wait_ms: its unit goes now, packed if complete, else rejected.
    expired = {t.seq for t in remaining if t.created_at + rules.max_wait_ms <= now}
    if expired:
        units = [u for u in units_of(remaining, rules.group_size) if any(t.seq in expired for t in u.tasks)]
        for package in _chunk([u for u in units if u.complete], rules.max_size):
            result.packages.append(package)
            result.flushes.append("max_wait")
            take(package)
        late = [t for u in units if not u.complete for t in u.tasks]
        result.rejected.extend(late)
        take(late)
        if len(remaining) < rules.min_size:
            started = ends = None
        last_flush = now

    maybe_start_timer()
    result.timer = TimerState(started, ends, last_flush, carried)
    dues = [t.created_at + rules.max_wait_ms for t in remaining]
    if ends is not None:
        dues.append(ends)
    result.next_due = min(dues) if dues else None
    return result
