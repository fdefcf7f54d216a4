"""The checker catches planted bugs (no servers: each test builds a history and a final state by hand)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.chaos.checker import FinalState, Violation, check
from tests.chaos.harness import SHORT, WorkdirInUse, run
from tests.chaos.history import FAIL, OK, UNKNOWN, History, Op, outcome_of


def _op(face: str, kind: str, key: str, outcome: str = OK, **value: object) -> Op:
    return Op(face, kind, key, outcome, dict(value))


def clean_run() -> tuple[list[Op], FinalState]:
    """A small run where every face kept its promises."""
    ops = [
        _op("exchange", "store", "m1"), _op("exchange", "store", "m2"), _op("exchange", "store", "m3", UNKNOWN),
        _op("machines", "start", "k1"),
        _op("machines", "call", "c1", machine="k1"), _op("machines", "call", "c2", UNKNOWN, machine="k1"),
        _op("machines", "call", "c3", FAIL, machine="k1"),
        _op("machines", "notify", "n1", machine="k1"),
        _op("interactions", "create", "i-msg-1", id="I1"), _op("interactions", "complete", "I1"),
        _op("batching", "submit", "t1", status="pending"), _op("batching", "submit", "t2", status="pending"),
        _op("batching", "complete", "P1", task_ids=["t1", "t2"]),
    ]
    final = FinalState(
        drained=True,
        exchange_effects={"m1": 1, "m2": 1},
        machines={"k1": {"status": "working", "history": [
            {"id": 1, "data": {"created": "k1"}}, {"id": 2, "data": {"call": "c1"}}, {"id": 3, "data": {"timer": 1}},
            {"id": 4, "data": {"notify": "n1"}}, {"id": 5, "data": {"call": "c2"}}, {"id": 6, "data": {"timer": 2}},
        ]}},
        timers_per_machine=2,
        interactions={"i-msg-1": {"id": "I1", "status": "completed"}},
        interaction_completed_events={"I1": 1},
        batch_tasks={"t1": {"status": "done", "package_id": "P1"}, "t2": {"status": "done", "package_id": "P1"}},
        batch_packages={"P1": {"status": "done", "task_ids": ["t1", "t2"]}},
    )
    return ops, final


def invariants(violations: list[Violation]) -> set[tuple[str, str]]:
    return {(v.face, v.invariant) for v in violations}


def test_a_clean_run_has_no_violation() -> None:
    ops, final = clean_run()
    assert check(ops, final) == []


def test_an_unknown_outcome_may_have_happened_or_not() -> None:
    ops, final = clean_run()
    final.exchange_effects["m3"] = 1
    machine = final.machines["k1"]["history"]
    final.machines["k1"]["history"] = [e for e in machine if e["data"] != {"call": "c2"}]
    for i, event in enumerate(final.machines["k1"]["history"], 1):
        event["id"] = i
    assert check(ops, final) == []


def test_planted_exchange_double_delivery_is_caught() -> None:
    ops, final = clean_run()
    final.exchange_effects["m1"] = 2
    assert ("exchange", "double_effect") in invariants(check(ops, final))


def test_planted_exchange_lost_message_is_caught() -> None:
    ops, final = clean_run()
    del final.exchange_effects["m2"]
    assert invariants(check(ops, final)) == {("exchange", "lost")}


def test_an_exchange_message_still_available_is_fine_until_the_quiet_period_ends() -> None:
    ops, final = clean_run()
    del final.exchange_effects["m2"]
    final.exchange_available.add("m2")
    final.drained = False
    assert check(ops, final) == []
    final.drained = True
    assert invariants(check(ops, final)) == {("exchange", "stuck")}


def test_planted_exchange_applied_and_still_available_is_caught() -> None:
    ops, final = clean_run()
    final.exchange_available.add("m1")
    final.drained = False
    assert invariants(check(ops, final)) == {("exchange", "committed_and_available")}


def test_an_exchange_process_left_in_doubt_is_stuck() -> None:
    ops, final = clean_run()
    final.exchange_open_processes.append({"id": "p9", "state": "IN_DOUBT"})
    assert invariants(check(ops, final)) == {("exchange", "stuck")}


def test_planted_exchange_invented_effect_is_caught() -> None:
    ops, final = clean_run()
    final.exchange_effects["ghost"] = 1
    assert invariants(check(ops, final)) == {("exchange", "invented")}


def test_planted_machine_history_gap_is_caught() -> None:
    ops, final = clean_run()
    final.machines["k1"]["history"][3]["id"] = 5
    final.machines["k1"]["history"][4]["id"] = 6
    final.machines["k1"]["history"][5]["id"] = 7
    assert ("machines", "history_gap") in invariants(check(ops, final))


def test_planted_duplicate_call_event_is_caught() -> None:
    ops, final = clean_run()
    history = final.machines["k1"]["history"]
    history.append({"id": 7, "data": {"call": "c1"}})
    assert invariants(check(ops, final)) == {("machines", "double_event")}


def test_planted_lost_acknowledged_call_is_caught() -> None:
    ops, final = clean_run()
    final.machines["k1"]["history"] = [
        {"id": i, "data": e["data"]} for i, e in enumerate((e for e in final.machines["k1"]["history"] if e["data"] != {"call": "c1"}), 1)
    ]
    assert invariants(check(ops, final)) == {("machines", "lost")}


def test_planted_refused_call_that_left_an_event_is_caught() -> None:
    ops, final = clean_run()
    final.machines["k1"]["history"].append({"id": 7, "data": {"call": "c3"}})
    assert invariants(check(ops, final)) == {("machines", "refused_but_applied")}


def test_planted_timer_fired_twice_is_caught() -> None:
    ops, final = clean_run()
    final.machines["k1"]["history"].append({"id": 7, "data": {"timer": 2}})
    assert invariants(check(ops, final)) == {("machines", "timer_fired_twice")}


def test_a_timer_that_never_fired_is_stuck() -> None:
    ops, final = clean_run()
    final.timers_per_machine = 3
    assert invariants(check(ops, final)) == {("machines", "stuck")}


def test_a_failed_machine_is_stuck() -> None:
    ops, final = clean_run()
    final.machines["k1"]["status"] = "failed"
    assert invariants(check(ops, final)) == {("machines", "stuck")}


def test_planted_interaction_completed_twice_is_caught() -> None:
    ops, final = clean_run()
    final.interaction_completed_events["I1"] = 2
    assert invariants(check(ops, final)) == {("interactions", "completed_twice")}
    ops, final = clean_run()
    ops.append(_op("interactions", "complete", "I1"))
    assert invariants(check(ops, final)) == {("interactions", "completed_twice")}


def test_planted_lost_interaction_is_caught() -> None:
    ops, final = clean_run()
    final.interactions.clear()
    assert invariants(check(ops, final)) == {("interactions", "lost")}


def test_an_unfinished_interaction_is_stuck() -> None:
    ops, final = clean_run()
    final.interactions["i-msg-1"]["status"] = "processing"
    final.interaction_completed_events.clear()
    assert invariants(check(ops, final)) == {("interactions", "stuck")}


def test_an_owner_holding_more_leases_at_once_than_its_limit_is_a_limit_exceeded() -> None:
    ops, final = clean_run()
    final.interaction_owner_concurrency = 2
    final.interaction_leases_held = [("ada", 0.0, 1.0), ("ada", 0.5, 2.0), ("ada", 1.0, 3.0), ("bo", 0.2, 0.9), ("", 0.1, 5.0)]
    assert check(ops, final) == []
    final.interaction_leases_held.append(("ada", 1.5, 1.6))
    assert invariants(check(ops, final)) == {("interactions", "limit_exceeded")}


def test_planted_task_in_two_completed_packages_is_caught() -> None:
    ops, final = clean_run()
    final.batch_packages["P2"] = {"status": "done", "task_ids": ["t2"]}
    assert invariants(check(ops, final)) == {("batching", "double_package")}


def test_planted_package_completed_twice_is_caught() -> None:
    ops, final = clean_run()
    ops.append(_op("batching", "complete", "P1", task_ids=["t1", "t2"]))
    assert ("batching", "package_completed_twice") in invariants(check(ops, final))


def test_planted_lost_task_is_caught() -> None:
    ops, final = clean_run()
    final.batch_packages["P1"]["task_ids"] = ["t1"]
    final.batch_tasks["t2"] = {"status": "pending", "package_id": None}
    ops[-1] = _op("batching", "complete", "P1", task_ids=["t1"])
    assert invariants(check(ops, final)) == {("batching", "stuck")}
    del final.batch_tasks["t2"]
    assert ("batching", "lost") in invariants(check(ops, final))


def test_history_round_trips_through_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history = History(path)
    with history.op("exchange", "store", "m1", mailbox="a/b") as op:
        op.value["id"] = "m1"
    with pytest.raises(httpx.ReadError), history.op("exchange", "store", "m2"):
        raise httpx.ReadError("connection reset")
    history.close()
    loaded = History.load(path)
    assert [(o.key, o.outcome) for o in loaded] == [("m1", OK), ("m2", UNKNOWN)]
    assert loaded[0].value == {"mailbox": "a/b", "id": "m1"}


def test_outcome_of_a_refusal_is_fail_and_of_a_dying_server_unknown() -> None:
    class Refused(Exception):
        status = 409

    class Dying(Exception):
        status = 503

    assert outcome_of(Refused()) == FAIL
    assert outcome_of(Dying()) == UNKNOWN
    assert outcome_of(httpx.ReadTimeout("slow")) == UNKNOWN
    assert outcome_of(httpx.ConnectError("refused")) == FAIL



async def test_a_run_refuses_a_workdir_that_holds_another_runs_files(tmp_path: Path) -> None:
    (tmp_path / "history.jsonl").write_text('{"face": "exchange"}\n')
    with pytest.raises(WorkdirInUse):
        await run(SHORT, tmp_path)
    assert (tmp_path / "history.jsonl").read_text() == '{"face": "exchange"}\n'
