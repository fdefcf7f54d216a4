"""The batch-forming rules on their own (no store): thresholds, timer, groups, max_wait."""

from __future__ import annotations

from mainspring.batching.planner import GroupLog, LogLine, PendingTask, Rules, TimerState, plan, units_of

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
