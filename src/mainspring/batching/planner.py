"""The batch-forming rules as a pure function: pending tasks + settings + timer state + now → what to do.

The dispatcher (``dispatcher.py``) reads the tasks really pending in the store under the batcher's lock,
asks ``plan`` and writes the answer in the same transaction, so the rules live here once, with no I/O.

A *unit* is what may travel only whole: ``group_size`` tasks of one ``group`` and one version (members
are distinct because a member holds each version once). Grouping by version keeps the two books of a pair
that changed together in one unit, and never pairs an old revision with a new one. A package holds one
version of a group too: when a group's earlier and later versions leave in the same round, the earlier one
goes in an earlier package.

A unit that would be packed or rejected while incomplete is completed, when it can be, by *reissuing* each
missing member's latest accepted content at the unit's version (API.md §4, "one member changed alone"): the
seed's pair where only one book changed still travels as a pair with equal versions. The dispatcher hands
the plan the groups' version logs for that (``GroupLog``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PendingTask:
    seq: int
    id: str
    group: str
    member: str
    version: int | None
    created_at: int
    reissue_of: str | None = None
    """Set on a task the plan makes to complete a group: the id of the task whose content it repeats."""


@dataclass(frozen=True)
class LogLine:
    """A line of a group's version log whose content counts as accepted (not withdrawn, task still stored)."""

    member: str
    version: int
    task_id: str


@dataclass
class GroupLog:
    """What the plan needs of one group's version log to complete its units by reissue."""

    accepted: list[LogLine]
    taken: set[tuple[str, int]]
    """Every (member, version) with a line, withdrawn or not: a reissue may not take one of them."""
    ids_taken: set[str] = field(default_factory=set)
    """Task ids already used in the batcher that a reissue of this group could collide with."""

    def copy(self) -> GroupLog:
        return GroupLog(list(self.accepted), set(self.taken), set(self.ids_taken))


def reissue_id(group: str, member: str, version: int) -> str:
    """The id API.md gives a reissued task."""
    return f"{group}:{member}:v{version}"


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
    reissued: list[PendingTask] = field(default_factory=list)
    """Tasks made to complete groups (``reissue_of`` set); each is in one of ``packages``."""
    needs_logs: set[str] = field(default_factory=set)
    """Groups kept incomplete that their version logs (not given to this plan) might complete by reissue."""


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


def reissues_for(unit: Unit, group_size: int, log: GroupLog | None, now: int) -> list[PendingTask] | None:
    """The tasks that complete ``unit`` by reissuing its missing members, or None when one of them was never
    accepted before (the unit then stays incomplete). Each missing member repeats its latest accepted content
    from before the unit's version; when the log knows more members than are missing (``group_size`` was
    lowered), the most recently changed ones are taken."""
    first = unit.tasks[0]
    if log is None or first.version is None:
        return None
    version = first.version
    present = {t.member for t in unit.tasks}
    latest: dict[str, LogLine] = {}
    for line in log.accepted:
        if line.member in present or line.version >= version or (line.member, version) in log.taken:
            continue
        if reissue_id(first.group, line.member, version) in log.ids_taken:
            continue
        if line.member not in latest or line.version > latest[line.member].version:
            latest[line.member] = line
    missing = group_size - len(present)
    if len(latest) < missing:
        return None
    chosen = sorted(latest.values(), key=lambda line: (-line.version, line.member))[:missing]
    made = [
        PendingTask(0, reissue_id(first.group, line.member, version), first.group, line.member, version, now, line.task_id)
        for line in chosen
    ]
    # A later unit of the group in this same plan sees these as the members' latest content. Their lines
    # name the stored task they repeat: a made task is only stored when the plan is written, so a later
    # reissue must take its content from where this one does.
    for task, line in zip(made, chosen, strict=True):
        log.taken.add((task.member, version))
        log.ids_taken.add(task.id)
        log.accepted.append(LogLine(task.member, version, line.task_id))
    return made


def decide_units(
    units: list[Unit], group_size: int, logs: Mapping[str, GroupLog], now: int
) -> tuple[list[Unit], list[PendingTask], list[PendingTask]]:
    """Units leaving the dispatcher now, oldest first: (the complete ones, some completed by reissue; the
    reissued tasks; the tasks of units that stay incomplete)."""
    complete: list[Unit] = []
    reissued: list[PendingTask] = []
    incomplete: list[PendingTask] = []
    for unit in units:
        if unit.complete:
            complete.append(unit)
            continue
        log = logs.get(unit.tasks[0].group)
        made = reissues_for(unit, group_size, log, now)
        if made is None:
            incomplete.extend(unit.tasks)
            if log is not None:
                # Rejected, their content no longer counts as accepted for a later unit of the group.
                gone = {t.id for t in unit.tasks}
                log.accepted = [line for line in log.accepted if line.task_id not in gone]
            continue
        complete.append(Unit(unit.tasks + made, True))
        reissued.extend(made)
    return complete, reissued, incomplete


def _chunk(units: list[Unit], max_size: int) -> list[list[PendingTask]]:
    """Whole units into packages of at most ``max_size`` tasks, keeping their order, with one version of a
    group per package: a unit of a group the package already holds at another version starts the next
    package, so a group's later version goes in a later package than its earlier one (units come oldest
    first, and a group's later version is always submitted after its earlier one)."""
    packages: list[list[PendingTask]] = []
    current: list[PendingTask] = []
    versions: dict[str, int | None] = {}
    for unit in units:
        first = unit.tasks[0]
        other_version = first.group in versions and versions[first.group] != first.version
        if current and (len(current) + len(unit.tasks) > max_size or other_version):
            packages.append(current)
            current = []
            versions = {}
        current = current + unit.tasks
        versions[first.group] = first.version
    if current:
        packages.append(current)
    return packages


def _at_max_size(remaining: dict[int, PendingTask], rules: Rules) -> list[list[PendingTask]]:
    """The packages the upper threshold makes, taken out of ``remaining``: while at least ``max_size`` tasks
    are pending, the oldest complete units that fit in ``max_size`` leave together (the same answer as
    splitting ``remaining`` into units again after every package, in one pass over the units: a round may
    find tens of thousands of tasks pending)."""
    packages: list[list[PendingTask]] = []
    if len(remaining) < rules.max_size:
        return packages
    units: list[Unit | None] = list(units_of(list(remaining.values()), rules.group_size))
    per_bucket: dict[tuple[str, int | None], int] = {}
    for unit in units:
        assert unit is not None
        key = (unit.tasks[0].group, unit.tasks[0].version)
        per_bucket[key] = per_bucket.get(key, 0) + 1
    first = 0  # units before it are gone or incomplete: an incomplete unit stays so until its bucket is split again
    while len(remaining) >= rules.max_size:
        chosen: list[int] = []
        size = 0
        for i in range(first, len(units)):
            unit = units[i]
            if unit is None or not unit.complete:
                if i == first:
                    first += 1
                continue
            if size + len(unit.tasks) <= rules.max_size:
                chosen.append(i)
                size += len(unit.tasks)
                if size == rules.max_size:
                    break
        if not chosen:
            break
        # The same tasks leave now as ever; two versions of one group among them go in two packages.
        leaving = [units[i] for i in chosen]
        for package in _chunk([u for u in leaving if u is not None], rules.max_size):
            packages.append(package)
            for task in package:
                remaining.pop(task.seq, None)
        split_again = False
        for i in chosen:
            unit = units[i]
            assert unit is not None
            key = (unit.tasks[0].group, unit.tasks[0].version)
            per_bucket[key] -= 1
            split_again = split_again or per_bucket[key] > 0
            units[i] = None
        if split_again:
            # A bucket kept other units (a repeated member, more members than ``group_size``): without the
            # tasks that left, its tasks may pair differently, so its units are made again, as the rule says.
            units = list(units_of(list(remaining.values()), rules.group_size))
            per_bucket = {}
            for unit in units:
                assert unit is not None
                key = (unit.tasks[0].group, unit.tasks[0].version)
                per_bucket[key] = per_bucket.get(key, 0) + 1
            first = 0
    return packages


def plan(
    pending: list[PendingTask], rules: Rules, state: TimerState, now: int, logs: Mapping[str, GroupLog] | None = None
) -> Plan:
    """Decide what happens to ``pending`` at ``now``. ``logs`` (by group) lets incomplete units that would
    leave now be completed by reissue; without it they are rejected or kept as the rules say."""
    result = Plan(timer=state)
    logs = {group: log.copy() for group, log in (logs or {}).items()}
    # By seq, the order arrival gives them; tasks leave by seq in constant time.
    remaining = {t.seq: t for t in sorted(pending, key=lambda t: t.seq)}
    started, ends, last_flush, carried = (
        state.linger_started_at,
        state.linger_ends_at,
        state.last_flush_at,
        state.carried_through_seq,
    )

    def take(tasks: list[PendingTask]) -> None:
        for task in tasks:
            if task.reissue_of is None:
                remaining.pop(task.seq, None)

    # 1. The upper threshold packs the oldest complete units at once and stops the timer.
    packed = _at_max_size(remaining, rules)
    if packed:
        result.packages.extend(packed)
        result.flushes.extend("max_size" for _ in packed)
        started = ends = None
        last_flush = now

    def changed_alone() -> list[PendingTask]:
        """New tasks of a later version (> 1) whose group is incomplete: a changed book resent without its
        partner. Its partners have content to reissue, so it need not wait for ``min_size`` (which a lone
        changed book never reaches) but only ``linger_ms``, the time its partners have to change too."""
        if rules.incomplete_group != "reject" or len(remaining) >= rules.min_size:
            return []
        units = units_of(list(remaining.values()), rules.group_size)
        return [t for u in units if not u.complete for t in u.tasks
                if t.seq > carried and t.version is not None and t.version > 1]

    def maybe_start_timer() -> None:
        nonlocal started, ends
        if ends is not None:
            return
        if not any(t.seq > carried for t in remaining.values()):
            return  # only tasks a timer already kept: nothing new can complete them, max_wait will
        if len(remaining) >= rules.min_size:
            # The timer starts when the count reached min_size, not when a server noticed, so it does not
            # depend on which server looks or how late.
            nth = sorted(t.created_at for t in remaining.values())[rules.min_size - 1]
        else:
            changed = changed_alone()
            if not changed:
                return
            nth = min(t.created_at for t in changed)  # the changed book's arrival, as stored
        started = max(nth, last_flush or nth)
        ends = started + rules.linger_ms

    # 2. The lower threshold starts the linger timer; 3. its end packs complete units.
    maybe_start_timer()
    if ends is not None and now >= ends:
        units = units_of(list(remaining.values()), rules.group_size)
        if rules.incomplete_group == "reject":
            complete, reissued, incomplete = decide_units(units, rules.group_size, logs, now)
            if len(remaining) < rules.min_size:
                # A timer started by a changed book alone completes by reissue what it can; what it cannot
                # (a member never accepted before) is kept, and waits for its partner until max_wait as a
                # lone task below min_size always has. The dispatcher reads those groups' logs if not given.
                result.needs_logs |= {t.group for t in incomplete if t.group not in logs}
                incomplete = []
        else:  # carry: an incomplete group waits for its partner (it leaves at max_wait at the latest)
            complete, reissued, incomplete = [u for u in units if u.complete], [], []
        for package in _chunk(complete, rules.max_size):
            result.packages.append(package)
            result.flushes.append("linger")
            take(package)
        result.reissued.extend(reissued)
        result.rejected.extend(incomplete)
        take(incomplete)
        carried = max([carried, *remaining])
        started = ends = None
        last_flush = now

    # 4. No task waits past max_wait_ms: its unit goes now, packed if complete, else rejected.
    expired = {t.seq for t in remaining.values() if t.created_at + rules.max_wait_ms <= now}
    if expired:
        units = [u for u in units_of(list(remaining.values()), rules.group_size) if any(t.seq in expired for t in u.tasks)]
        complete, reissued, late = decide_units(units, rules.group_size, logs, now)
        for package in _chunk(complete, rules.max_size):
            result.packages.append(package)
            result.flushes.append("max_wait")
            take(package)
        result.reissued.extend(reissued)
        result.rejected.extend(late)
        take(late)
        if len(remaining) < rules.min_size and not changed_alone():
            started = ends = None
        last_flush = now

    maybe_start_timer()
    result.timer = TimerState(started, ends, last_flush, carried)
    dues = [t.created_at + rules.max_wait_ms for t in remaining.values()]
    if ends is not None:
        dues.append(ends)
    result.next_due = min(dues) if dues else None
    return result
