"""The checker catches planted bugs (no servers: each test builds a history and a final state by hand)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.chaos import checker
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
        _op("workflows", "start", "f1"), _op("workflows", "start", "f2", UNKNOWN),
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
        workflow_steps=3, workflow_processes={1: 10.0, 2: 50.0},
        workflow_runs={"f1": {"status": "completed", "result": ["a", "b2", "c"], "error": None, "steps": [
            {"n": 1, "kind": "step", "name": "act1", "result": "a"}, {"n": 2, "kind": "step", "name": "act2", "result": "b2"},
            {"n": 3, "kind": "sleep", "name": None}, {"n": 4, "kind": "step", "name": "act3", "result": "c"},
        ]}},
        # act2 ran twice: its server died after the first call, before its record; the second call was recorded.
        workflow_calls=[_call("f1", 1, "a", at=100), _call("f1", 2, "b1", at=101, pid=2), _call("f1", 2, "b2", at=103),
                        _call("f1", 3, "c", at=105)],
    )
    return ops, final


def _call(run: str, place: int, token: str, key: str | None = None, at: float = 100.0, pid: int = 1) -> dict[str, Any]:
    return {"run": run, "place": place, "key": key or f"{run}:{place}", "token": token, "at": at, "pid": pid}


def invariants(violations: list[Violation]) -> set[tuple[str, str]]:
    return {(v.face, v.invariant) for v in violations}


def test_a_clean_run_has_no_violation() -> None:
    ops, final = clean_run()
    assert check(ops, final) == []


def test_an_unknown_outcome_may_have_happened_or_not() -> None:
    ops, final = clean_run()
    final.exchange_effects["m3"] = 1
    final.machines["k1"]["history"] = _renumbered([e for e in final.machines["k1"]["history"] if e["data"] != {"call": "c2"}])
    assert check(ops, final) == []


def test_an_exchange_message_still_available_is_fine_until_the_quiet_period_ends() -> None:
    ops, final = clean_run()
    del final.exchange_effects["m2"]
    final.exchange_available.add("m2")
    final.drained = False
    assert check(ops, final) == []
    final.drained = True
    assert invariants(check(ops, final)) == {("exchange", "stuck")}


def test_a_recorded_step_called_again_by_a_server_that_held_the_run_at_the_same_time_is_allowed() -> None:
    ops, final = clean_run()
    final.workflow_calls.insert(2, _call("f1", 1, "a2", at=102, pid=2))  # process 2 started before act2 was called
    assert check(ops, final) == []
    final.workflow_processes[2] = 100.5  # ... but after process 1 recorded act1 and went on to act2
    final.workflow_calls[2]["at"] = 100.7
    final.workflow_calls[0]["at"] = 99.0
    final.workflow_calls[1]["at"] = 100.2
    final.workflow_calls.insert(2, _call("f1", 2, "b0", at=100.1))
    assert ("workflows", "recorded_step_ran_again") in invariants(check(ops, final))


def test_an_owner_within_its_limit_at_every_moment_is_no_limit_exceeded() -> None:
    ops, final = clean_run()
    final.interaction_owner_concurrency = 2
    final.interaction_leases_held = [("ada", 0.0, 1.0), ("ada", 0.5, 2.0), ("ada", 1.0, 3.0), ("bo", 0.2, 0.9), ("", 0.1, 5.0)]
    assert check(ops, final) == []


def test_a_lost_task_is_stuck_and_one_gone_from_the_store_lost() -> None:
    ops, final = clean_run()
    final.batch_packages["P1"]["task_ids"] = ["t1"]
    final.batch_tasks["t2"] = {"status": "pending", "package_id": None}
    ops[-1] = _op("batching", "complete", "P1", task_ids=["t1"])
    assert invariants(check(ops, final)) == {("batching", "stuck")}
    del final.batch_tasks["t2"]
    assert ("batching", "lost") in invariants(check(ops, final))


# --- every violation the checker knows, planted one at a time into the clean run ------------------------------------


def _renumbered(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": i, "data": e["data"]} for i, e in enumerate(history, 1)]


def _without(final: FinalState, data: dict[str, Any]) -> None:
    final.machines["k1"]["history"] = _renumbered([e for e in final.machines["k1"]["history"] if e["data"] != data])


def _lease_beyond_the_limit(final: FinalState) -> None:
    final.interaction_owner_concurrency = 2
    final.interaction_leases_held = [("ada", 0.0, 1.0), ("ada", 0.5, 2.0), ("ada", 1.0, 3.0), ("ada", 1.5, 1.6)]


def _task_done_without_package(ops: list[Op], final: FinalState) -> None:
    final.drained = False
    final.batch_packages["P1"]["task_ids"] = ["t1"]
    ops[-1] = _op("batching", "complete", "P1", task_ids=["t1"])


Plant = Callable[[list[Op], FinalState], Any]
PLANTED: dict[str, tuple[Plant, set[tuple[str, str]]]] = {
    # exchange
    "double_delivery": (lambda ops, final: final.exchange_effects.update(m1=2), {("exchange", "double_effect")}),
    "lost_message": (lambda ops, final: final.exchange_effects.pop("m2"), {("exchange", "lost")}),
    "applied_and_still_available": (lambda ops, final: (final.exchange_available.add("m1"), setattr(final, "drained", False)),
                                    {("exchange", "committed_and_available")}),
    "refused_store_applied": (lambda ops, final: (ops.append(_op("exchange", "store", "m4", FAIL)), final.exchange_effects.update(m4=1)),
                              {("exchange", "refused_but_applied")}),
    "message_available_after_the_quiet_period": (lambda ops, final: (final.exchange_effects.pop("m2"), final.exchange_available.add("m2")),
                                                 {("exchange", "stuck")}),
    "process_left_in_doubt": (lambda ops, final: final.exchange_open_processes.append({"id": "p9", "state": "IN_DOUBT"}),
                              {("exchange", "stuck")}),
    "effect_never_stored": (lambda ops, final: final.exchange_effects.update(ghost=1), {("exchange", "invented")}),
    # machines
    "started_machine_lost": (lambda ops, final: ops.append(_op("machines", "start", "k2")), {("machines", "lost")}),
    "history_gap": (lambda ops, final: [e.update(id=e["id"] + 1) for e in final.machines["k1"]["history"][3:]], {("machines", "history_gap")}),
    "call_event_twice": (lambda ops, final: final.machines["k1"]["history"].append({"id": 7, "data": {"call": "c1"}}),
                         {("machines", "double_event")}),
    "acknowledged_call_lost": (lambda ops, final: _without(final, {"call": "c1"}), {("machines", "lost")}),
    "acknowledged_notify_lost": (lambda ops, final: _without(final, {"notify": "n1"}), {("machines", "lost")}),
    "refused_call_applied": (lambda ops, final: final.machines["k1"]["history"].append({"id": 7, "data": {"call": "c3"}}),
                             {("machines", "refused_but_applied")}),
    "event_nobody_sent": (lambda ops, final: final.machines["k1"]["history"].append({"id": 7, "data": {"call": "c9"}}),
                          {("machines", "invented")}),
    "timer_fired_twice": (lambda ops, final: final.machines["k1"]["history"].append({"id": 7, "data": {"timer": 2}}),
                          {("machines", "timer_fired_twice")}),
    "timers_out_of_order": (lambda ops, final: (final.machines["k1"]["history"][2].update(data={"timer": 2}),
                                                final.machines["k1"]["history"][5].update(data={"timer": 1})),
                            {("machines", "timer_out_of_order")}),
    "failed_machine": (lambda ops, final: final.machines["k1"].update(status="failed"), {("machines", "stuck")}),
    "timer_never_fired": (lambda ops, final: setattr(final, "timers_per_machine", 3), {("machines", "stuck")}),
    "machine_nobody_started": (lambda ops, final: final.machines.update(k9={"status": "working", "history": []}), {("machines", "invented")}),
    # interactions
    "created_interaction_lost": (lambda ops, final: final.interactions.clear(), {("interactions", "lost")}),
    "refused_creation_exists": (lambda ops, final: (ops.append(_op("interactions", "create", "i-msg-2", FAIL)),
                                                    final.interactions.update({"i-msg-2": {"id": "I2", "status": "completed"}}),
                                                    final.interaction_completed_events.update(I2=1)),
                                {("interactions", "refused_but_created")}),
    "two_completed_events": (lambda ops, final: final.interaction_completed_events.update(I1=2), {("interactions", "completed_twice")}),
    "two_acknowledged_completes": (lambda ops, final: ops.append(_op("interactions", "complete", "I1")), {("interactions", "completed_twice")}),
    "completed_without_its_event": (lambda ops, final: final.interaction_completed_events.clear(), {("interactions", "event_lost")}),
    "interaction_unfinished": (lambda ops, final: (final.interactions["i-msg-1"].update(status="processing"),
                                                   final.interaction_completed_events.clear()),
                               {("interactions", "stuck")}),
    "interaction_nobody_created": (lambda ops, final: (final.interactions.update({"i-ghost": {"id": "I9", "status": "completed"}}),
                                                       final.interaction_completed_events.update(I9=1)),
                                   {("interactions", "invented")}),
    "owner_over_its_limit": (lambda ops, final: _lease_beyond_the_limit(final), {("interactions", "limit_exceeded")}),
    # batching
    "package_completed_twice": (lambda ops, final: ops.append(_op("batching", "complete", "P1", task_ids=["t1", "t2"])),
                                {("batching", "package_completed_twice"), ("batching", "double_package")}),
    "task_nobody_submitted": (lambda ops, final: final.batch_packages.update(P2={"status": "done", "task_ids": ["t9"]}),
                              {("batching", "invented")}),
    "task_in_two_completed_packages": (lambda ops, final: final.batch_packages.update(P2={"status": "done", "task_ids": ["t2"]}),
                                       {("batching", "double_package")}),
    "task_in_two_acknowledged_packages": (lambda ops, final: ops.append(_op("batching", "complete", "P2", task_ids=["t1"])),
                                          {("batching", "double_package")}),
    "unanswered_task_in_two_packages": (lambda ops, final: (ops.append(_op("batching", "submit", "t3", UNKNOWN)),
                                                            final.batch_packages.update(P2={"status": "done", "task_ids": ["t3"]},
                                                                                        P3={"status": "done", "task_ids": ["t3"]})),
                                        {("batching", "double_package")}),
    "duplicate_in_a_package": (lambda ops, final: (ops.append(_op("batching", "submit", "t4", status="rejected", reason="duplicate")),
                                                   final.batch_packages.update(P2={"status": "done", "task_ids": ["t4"]})),
                               {("batching", "rejected_but_packaged")}),
    "accepted_task_gone": (lambda ops, final: final.batch_tasks.pop("t2"), {("batching", "lost")}),
    "task_done_without_package": (_task_done_without_package, {("batching", "done_without_package")}),
    "task_unfinished": (lambda ops, final: final.batch_tasks["t2"].update(status="claimed"), {("batching", "stuck")}),
    # workflows
    "started_run_lost": (lambda ops, final: final.workflow_runs.clear(), {("workflows", "lost"), ("workflows", "invented")}),
    "refused_start_exists": (lambda ops, final: (ops.append(_op("workflows", "start", "f3", FAIL)),
                                                 final.workflow_runs.update(f3={"status": "completed", "result": [None] * 3, "steps": []})),
                             {("workflows", "refused_but_started")}),
    "step_ran_three_times": (lambda ops, final: final.workflow_calls.insert(1, _call("f1", 2, "b0")),
                             {("workflows", "step_ran_more_than_twice")}),
    "key_changed_on_the_rerun": (lambda ops, final: final.workflow_calls[1].update(key="f1:other"), {("workflows", "key_changed")}),
    "recorded_step_called_again": (lambda ops, final: final.workflow_calls.append(_call("f1", 1, "a2", at=106)),
                                   {("workflows", "recorded_step_ran_again")}),
    "record_of_no_call": (lambda ops, final: final.workflow_calls.pop(), {("workflows", "record_without_call")}),
    "result_not_its_records": (lambda ops, final: final.workflow_runs["f1"].update(result=["a", "b1", "c"]),
                               {("workflows", "result_mismatch")}),
    "run_failed": (lambda ops, final: final.workflow_runs["f1"].update(status="failed", error={"type": "x"}), {("workflows", "stuck")}),
    "run_nobody_started": (lambda ops, final: final.workflow_runs.update(f9={"status": "completed", "result": [None] * 3, "steps": []}),
                           {("workflows", "invented")}),
    "step_of_a_run_that_does_not_exist": (lambda ops, final: final.workflow_calls.append(_call("f8", 1, "z")),
                                          {("workflows", "invented")}),
}


@pytest.mark.parametrize("planted", list(PLANTED))
def test_each_planted_violation_is_caught_and_nothing_else(planted: str) -> None:
    plant, expected = PLANTED[planted]
    ops, final = clean_run()
    plant(ops, final)
    assert invariants(check(ops, final)) == expected


def _checked_invariants() -> set[tuple[str, str]]:
    """Every (face, invariant) a ``Violation(...)`` of checker.py can carry, read from its source."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(Path(checker.__file__).read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Violation":
            face, invariant = node.args[0], node.args[1]
            names = [invariant.body, invariant.orelse] if isinstance(invariant, ast.IfExp) else [invariant]
            found |= {(face.value, n.value) for n in names if isinstance(face, ast.Constant) and isinstance(n, ast.Constant)}
    return found


def test_every_violation_the_checker_knows_is_planted_here() -> None:
    """A new check comes with a planted case in PLANTED."""
    known = _checked_invariants()
    assert len(known) > 20, "the checker's source was not read"
    assert known - set().union(*(expected for _, expected in PLANTED.values())) == set()


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
