"""A run as the API shows it, from its machine and its history (the records of ``engine``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Required, TypedDict, cast

from mainspring.machines.data import HistoryRow, MachineRow, machine_subject
from mainspring.store import format_time
from mainspring.types import JsonData, JsonObject

if TYPE_CHECKING:
    from mainspring.workflows.engine import Run

FINISHED_STATUSES = ("completed", "failed", "cancelled")


class Record(TypedDict, total=False):
    """One record of a run's history: ``wf`` says which (``start``, ``step``, ``sleep``, ``took``, ``end``…) and
    which of the other fields it has."""

    wf: Required[str]
    n: int
    name: str
    id: str
    signal: str
    s: int
    until: int | None
    item: str | None
    queue: str
    args: JsonData
    result: JsonData
    error: JsonData
    payload: JsonData
    status: str
    value: JsonData


class RunAux(TypedDict, total=False):
    """A run's machine's aux state: what its status and the lists show without reading its history."""

    status: str
    waiting_for: JsonObject | None
    result: JsonData
    error: JsonObject | None
    finished_at: int | None
    ended: bool
    watchers: list[JsonData]
    """Parents to tell when the run ends: ``[name, id, n]`` each."""


class RunView(TypedDict, total=False):
    """A run as the API shows it (API.md §5); ``steps`` only where the history was read."""

    name: Required[str]
    id: Required[str]
    status: Required[str]
    args: Required[JsonData]
    result: Required[JsonData]
    error: Required[JsonObject | None]
    waiting_for: Required[JsonObject | None]
    created_at: Required[str | None]
    updated_at: Required[str | None]
    finished_at: Required[str | None]
    steps: list[JsonObject]


def record_of(data: JsonData) -> Record:
    """A history event of a run's machine as the record it is (the workflows layer writes them all)."""
    return cast(Record, data)


def aux_of(machine: MachineRow) -> RunAux:
    """A run's aux state (empty before its first step wrote one)."""
    return cast(RunAux, machine.aux_state or {})


def as_json(value: Record | RunAux) -> JsonObject:
    """A record or aux state as the JSON object it is, to be stored (mypy sees no TypedDict as JSON)."""
    return cast(JsonObject, value)


def as_json_all(written: list[Record]) -> list[JsonData]:
    """Records as the JSON objects they are (as ``as_json``), the same list."""
    return cast(list[JsonData], written)
SUBJECT = "workflow"
MAX_MESSAGE_ID = 128
"""The interactions face's longest message id."""


def task_message_id(name: str, run_id: str, uid: int, n: int) -> str:
    """``wf:<name>:<id>:<n>``; a run whose id would make it too long, or starts with ``#``, is named by its machine
    instead: ``wf:<name>:#<uid>:<n>``."""
    wanted = f"wf:{name}:{run_id}:{n}"
    if len(wanted) <= MAX_MESSAGE_ID and not run_id.startswith("#"):
        return wanted
    return f"wf:{name}:#{uid}:{n}"


def parse_message_id(message_id: str) -> tuple[str, str | int, int] | None:
    """(workflow name, run id or machine uid, n) of a task's message id; None when it is none."""
    if not message_id.startswith("wf:"):
        return None
    name, sep, rest = message_id[3:].partition(":")
    run_part, sep2, n = rest.rpartition(":")
    if not sep or not sep2 or not n.isdigit() or not run_part:
        return None
    if run_part.startswith("#") and run_part[1:].isdigit():
        return name, int(run_part[1:]), int(n)
    return name, run_part, int(n)


def child_done(n: int, child: RunView) -> Record:
    return {"wf": "child_done", "n": n, "status": child["status"], "result": child.get("result"), "error": child.get("error")}


def announce(run: Run, aux: RunAux) -> list[tuple[str, str, str, object]]:
    """The event a run's last step writes besides its records: ``workflow.<status>`` (a cancelled run said so
    when it was cancelled), as (type, subject kind, subject id, data)."""
    status = aux["status"]
    if status == "cancelled":
        return []
    data: JsonObject = {"name": run.name, "id": run.run_id, "status": status}
    error = aux.get("error")
    if error is not None:
        data["error"] = {"type": error["type"], "message": error["message"]}
    return [(f"workflow.{status}", SUBJECT, machine_subject(run.name, run.run_id), data)]


def steps_of(history: Sequence[HistoryRow]) -> list[JsonObject]:
    """The run's timeline: one entry per call (updated by its completion) and per signal, in history order."""
    steps: list[JsonObject] = []
    by_n: dict[int, JsonObject] = {}
    for row in history[1:]:
        record = record_of(row.data if isinstance(row.data, dict) else {})
        kind = record.get("wf")
        at = format_time(row.created_at)
        n = int(record.get("n") or 0)
        if kind == "step":
            entry: JsonObject = {"n": n, "kind": "step", "name": record.get("name"), "at": at}
            entry.update({"error": record["error"]} if "error" in record else {"result": record.get("result")})
            steps.append(entry)
        elif kind in ("sleep", "wait", "task", "child"):
            name = {"sleep": None, "wait": record.get("signal"), "task": record.get("queue"), "child": record.get("name")}[kind]
            entry = {"n": n, "kind": kind, "name": name, "result": None, "at": at}
            if kind == "sleep":
                entry["until"] = format_time(record.get("until"))
            elif kind == "wait" and record.get("until") is not None:
                entry["until"] = format_time(record["until"])
            elif kind == "task":
                entry["task"] = record.get("item")
            elif kind == "child":
                entry["child"] = record.get("id")
            by_n[n] = entry
            steps.append(entry)
        elif kind == "took":
            entry = by_n.get(n) or {"n": n, "kind": "wait", "name": record.get("signal"), "at": at}
            if n not in by_n:
                by_n[n] = entry
                steps.append(entry)
            entry.update(result=record.get("payload"), at=at)
        elif kind == "woke" and n in by_n:
            by_n[n].update(result=None, at=at)
        elif kind == "timeout" and n in by_n:
            by_n[n].pop("result", None)
            by_n[n].update(error={"type": "TimeoutError", "message": "no signal came in time"}, at=at)
        elif kind in ("task_done", "child_done") and n in by_n:
            entry = by_n[n]
            entry["at"] = at
            if record.get("status") == "completed":
                entry["result"] = record.get("result")
            else:
                entry.pop("result", None)
                error = record.get("error")
                if kind == "task_done":
                    entry["error"] = {"type": "TaskFailed", "message": error if isinstance(error, str) else record.get("status")}
                else:
                    entry["error"] = error if isinstance(error, dict) else {"type": record.get("status"), "message": ""}
        elif kind == "signal":
            steps.append({"n": None, "kind": "signal", "name": record.get("name"), "result": record.get("payload"), "at": at})
        elif kind in ("now", "uuid"):
            steps.append({"n": n, "kind": kind, "name": None, "result": record.get("value"), "at": at})
        elif kind == "patch":
            steps.append({"n": n, "kind": "patch", "name": record.get("name"), "result": True, "at": at})
    return steps


def run_to_api(machine: MachineRow, args: JsonData, history: Sequence[HistoryRow] | None) -> RunView:
    """A run: API.md §5's shape (without ``steps`` when ``history`` is None)."""
    aux: RunAux = aux_of(machine) if isinstance(machine.aux_state, dict) else {}
    status = aux.get("status", "running")
    if machine.status == "failed" and status not in FINISHED_STATUSES:
        status = "failed"
    waiting = aux.get("waiting_for")
    if isinstance(waiting, dict) and "until" in waiting:
        waiting = {"until": format_time(cast(int, waiting["until"]))}
    error = aux.get("error")
    run: RunView = {
        "name": machine.namespace,
        "id": machine.id,
        "status": status,
        "args": args,
        "result": aux.get("result"),
        "error": None if error is None else {"type": error.get("type"), "message": error.get("message"), "traceback": error.get("traceback")},
        "waiting_for": waiting if status not in FINISHED_STATUSES else None,
        "created_at": format_time(machine.created_at),
        "updated_at": format_time(machine.updated_at),
        "finished_at": format_time(aux.get("finished_at")) if status in FINISHED_STATUSES else None,
    }
    if history is not None:
        run["steps"] = steps_of(history)
    return run
