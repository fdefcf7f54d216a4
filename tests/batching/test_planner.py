"""The batch-forming rules on their own (no store): thresholds, timer, groups, max_wait."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mainspring.batching import planner
from mainspring.batching.planner import (
    GroupLog,
    LogLine,
    PendingTask,
    Rules,
    TimerState,
    Unit,
    _at_max_size,
    _chunk,
    plan,
    units_of,
)

RULES = Rules(min_size=2, max_size=6, linger_ms=5000, max_wait_ms=30000, group_size=2, incomplete_group="reject")
IDLE = TimerState(None, None, None, 0)


def pair(seq: int, group: str, at: int = 0, version: int = 1) -> list[PendingTask]:
    return [PendingTask(seq, f"{group}-en", group, "en", version, at), PendingTask(seq + 1, f"{group}-ru", group, "ru", version, at)]


def test_below_min_size_nothing_happens_until_max_wait() -> None:
    lone = [PendingTask(1, "a", "g", "en", 1, 0)]
    decided = plan(lone, RULES, IDLE, 1000)
    assert decided.packages == [] and decided.rejected == [] and decided.timer.linger_ends_at is None
    assert decided.next_due == 30000


def test_min_size_starts_the_timer_at_the_arrival_of_the_min_size_th_task() -> None:
    tasks = [PendingTask(1, "a", "g", "en", 1, 100), PendingTask(2, "b", "g", "ru", 1, 700)]
    decided = plan(tasks, RULES, IDLE, 900)
    assert (decided.timer.linger_started_at, decided.timer.linger_ends_at) == (700, 5700)
    assert decided.next_due == 5700 and decided.packages == []


def test_a_timer_found_ended_late_flushes_at_once() -> None:
    decided = plan(pair(1, "g"), RULES, IDLE, 60_000)
    assert [[t.id for t in p] for p in decided.packages] == [["g-en", "g-ru"]]


def test_max_size_packs_only_whole_groups_oldest_first() -> None:
    tasks = [PendingTask(1, "x", "x", "en", 1, 0), *pair(2, "a"), *pair(4, "b"), *pair(6, "c"), *pair(8, "d")]
    decided = plan(tasks, RULES, IDLE, 0)
    assert [[t.id for t in p] for p in decided.packages] == [["a-en", "a-ru", "b-en", "b-ru", "c-en", "c-ru"]]
    assert decided.flushes == ["max_size"]


def test_units_keep_versions_apart() -> None:
    tasks = [PendingTask(1, "a1", "g", "en", 1, 0), PendingTask(2, "b2", "g", "ru", 2, 0)]
    assert [u.complete for u in units_of(tasks, 2)] == [False, False]


def test_carry_keeps_incomplete_groups_without_restarting_the_timer_for_them() -> None:
    rules = Rules(2, 6, 5000, 30000, 2, "carry")
    tasks = [PendingTask(1, "a", "a", "en", 1, 0), PendingTask(2, "b", "b", "en", 1, 0)]
    decided = plan(tasks, rules, IDLE, 5000)
    assert decided.packages == [] and decided.rejected == []
    assert decided.timer.linger_ends_at is None and decided.timer.carried_through_seq == 2
    again = plan(tasks, rules, decided.timer, 6000)
    assert again.timer.linger_ends_at is None and again.next_due == 30000
    late = plan(tasks, rules, decided.timer, 30000)
    assert [t.id for t in late.rejected] == ["a", "b"]


def test_a_groups_two_versions_leaving_together_go_in_two_packages_the_earlier_first() -> None:
    # Both pairs of book g (version 1, then both books changed: version 2) leave in one flush, by each rule
    # that makes packages; each package holds one version of the group, version 1 first.
    tasks = [*pair(1, "g", at=0), PendingTask(3, "g-en-2", "g", "en", 2, 0), PendingTask(4, "g-ru-2", "g", "ru", 2, 0)]
    by_rule = {
        "max_size": plan(tasks, Rules(2, 4, 5000, 30000, 2, "reject"), IDLE, 0),
        "linger": plan(tasks, RULES, IDLE, 5000),
        "max_wait": plan(tasks, Rules(5, 6, 5000, 30000, 2, "reject"), IDLE, 30000),
    }
    for rule, decided in by_rule.items():
        assert [[t.id for t in p] for p in decided.packages] == [["g-en", "g-ru"], ["g-en-2", "g-ru-2"]], rule
        assert decided.flushes == [rule, rule]


def test_one_version_per_group_does_not_split_other_groups_or_a_group_size_of_one() -> None:
    tasks = [*pair(1, "a"), *pair(3, "b")]
    assert [len(p) for p in plan(tasks, RULES, IDLE, 5000).packages] == [4]
    singles = [PendingTask(1, "en", "g", "en", 1, 0), PendingTask(2, "ru", "g", "ru", 1, 0)]
    assert [[t.id for t in p] for p in plan(singles, Rules(2, 6, 5000, 30000, 1, "reject"), IDLE, 5000).packages] == [["en", "ru"]]


def test_two_versions_completed_by_reissue_in_one_round_both_repeat_the_stored_task() -> None:
    # Book g went out as a pair; then its English book changed twice (versions 2 and 3) before the timer
    # ended. Both versions are completed by reissuing the Russian book, each repeating the stored task
    # (the reissue made for version 2 is not stored until the plan is written).
    log = GroupLog(accepted=[LogLine("en", 1, "g-en"), LogLine("ru", 1, "g-ru"), LogLine("en", 2, "g-en-2"),
                             LogLine("en", 3, "g-en-3")],
                   taken={("en", 1), ("ru", 1), ("en", 2), ("en", 3)})
    tasks = [PendingTask(3, "g-en-2", "g", "en", 2, 0), PendingTask(4, "g-en-3", "g", "en", 3, 0)]
    decided = plan(tasks, RULES, IDLE, 5000, {"g": log})
    assert [[(t.id, t.reissue_of) for t in p] for p in decided.packages] == [
        [("g-en-2", None), ("g:ru:v2", "g-ru")],
        [("g-en-3", None), ("g:ru:v3", "g-ru")],
    ]


def _max_size_splitting_units_again_after_every_package(pending: list[PendingTask], rules: Rules) -> list[list[PendingTask]]:
    """The upper threshold as the rule reads (and as the planner once ran it): split what remains into units
    again after every package."""
    remaining = sorted(pending, key=lambda t: t.seq)
    packages: list[list[PendingTask]] = []
    while len(remaining) >= rules.max_size:
        chosen, size = [], 0
        for unit in units_of(remaining, rules.group_size):
            if unit.complete and size + len(unit.tasks) <= rules.max_size:
                chosen.append(unit)
                size += len(unit.tasks)
        if not chosen:
            break
        for package in _chunk(chosen, rules.max_size):
            packages.append(package)
            gone = {t.seq for t in package}
            remaining = [t for t in remaining if t.seq not in gone]
    return packages


@settings(max_examples=300, deadline=None)
@given(
    tasks=st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from(["en", "ru", "fr"]), st.integers(1, 3)), max_size=40),
    max_size=st.integers(1, 8),
    group_size=st.integers(1, 3),
)
def test_max_size_packs_what_splitting_units_again_after_every_package_packs(
    tasks: list[tuple[str, str, int]], max_size: int, group_size: int
) -> None:
    # Repeated members and more members than group_size included: the cases where a bucket's units change
    # once some of its tasks have left.
    pending = [PendingTask(seq, f"t{seq}", group, member, version, 0) for seq, (group, member, version) in enumerate(tasks, 1)]
    rules = Rules(1, max(max_size, group_size), 5000, 30000, group_size, "reject")
    remaining = {t.seq: t for t in pending}
    fast = _at_max_size(remaining, rules)
    expected = _max_size_splitting_units_again_after_every_package(pending, rules)
    assert [[t.id for t in p] for p in fast] == [[t.id for t in p] for p in expected]
    assert sorted(remaining) == sorted({t.seq for t in pending} - {t.seq for p in expected for t in p})


def test_max_size_splits_ten_thousand_pending_tasks_into_units_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Splitting them again after every package made one round of 10,000 pending tasks cost 1,667 splits
    # (quadratic: ~15 s of one core); the tasks now leave the units they were split into once.
    calls = []

    def counted(pending: list[PendingTask], group_size: int) -> list[Unit]:
        calls.append(len(pending))
        return units_of(pending, group_size)

    monkeypatch.setattr(planner, "units_of", counted)
    tasks = [t for g in range(5000) for t in pair(2 * g + 1, f"g{g}")]
    decided = plan(tasks, RULES, IDLE, 0)
    assert len(decided.packages) == 10000 // 6 and decided.flushes == ["max_size"] * (10000 // 6)
    assert calls == [10000]


def test_a_changed_book_alone_starts_the_timer_below_min_size_and_leaves_with_its_partners_reissue() -> None:
    changed = [PendingTask(3, "g-en-2", "g", "en", 2, 1000)]
    started = plan(changed, RULES, IDLE, 1200)
    assert started.packages == [] and (started.timer.linger_started_at, started.timer.linger_ends_at) == (1000, 6000)
    assert started.next_due == 6000
    log = GroupLog([LogLine("en", 1, "g-en"), LogLine("ru", 1, "g-ru"), LogLine("en", 2, "g-en-2")],
                   {("en", 1), ("ru", 1), ("en", 2)})
    ended = plan(changed, RULES, started.timer, 6000, {"g": log})
    assert [[t.id for t in p] for p in ended.packages] == [["g-en-2", "g:ru:v2"]] and ended.rejected == []


def test_a_timer_started_by_a_changed_book_alone_rejects_nothing_it_cannot_complete() -> None:
    changed = [PendingTask(3, "g-en-2", "g", "en", 2, 1000)]
    started = plan(changed, RULES, IDLE, 1000)
    ended = plan(changed, RULES, started.timer, 6000)
    assert ended.packages == [] and ended.rejected == [] and ended.needs_logs == {"g"}
    never = GroupLog([LogLine("en", 2, "g-en-2")], {("en", 1), ("en", 2)})
    kept = plan(changed, RULES, started.timer, 6000, {"g": never})
    assert kept.packages == [] and kept.rejected == [] and kept.timer.linger_ends_at is None
    assert plan(changed, RULES, kept.timer, 7000).timer.linger_ends_at is None  # kept: no new timer by itself
    assert kept.next_due == 31000


def test_with_carry_a_changed_book_alone_starts_no_timer() -> None:
    carry = Rules(**{**RULES.__dict__, "incomplete_group": "carry"})
    decided = plan([PendingTask(3, "g-en-2", "g", "en", 2, 1000)], carry, IDLE, 1200)
    assert decided.timer.linger_ends_at is None and decided.next_due == 31000


def test_another_tasks_max_wait_does_not_restart_a_changed_books_timer() -> None:
    rules = Rules(**{**RULES.__dict__, "min_size": 3})
    tasks = [PendingTask(1, "h-en", "h", "en", 1, 0), PendingTask(3, "g-en-2", "g", "en", 2, 27000)]
    started = plan(tasks, rules, IDLE, 27000)
    assert (started.timer.linger_started_at, started.timer.linger_ends_at) == (27000, 32000)
    late = plan(tasks, rules, started.timer, 30000)
    assert [t.id for t in late.rejected] == ["h-en"] and late.timer.linger_ends_at == 32000
