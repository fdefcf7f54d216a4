"""API models of workflows (API.md §5)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from mainspring.core.paging import MachineIdCursor
from mainspring.core.types import JsonValue, Page, Query
from mainspring.machines.models import MachineName, check_machine_name

WorkflowName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
RunId = MachineName
SignalName = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(check_machine_name)]
Status = Literal["running", "sleeping", "waiting", "completed", "failed", "cancelled"]


class StartIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: RunId | None = None
    """Free text up to 1 KiB; default a new uuid. Start is idempotent by id."""
    args: JsonValue = None


class SignalIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    payload: JsonValue = None


class RunError(BaseModel):
    type: str | None
    message: str | None
    traceback: str | None = None


class _StepBase(BaseModel):
    """One entry of a run's timeline: a call (``n``: its number) or a signal (``n``: null). Beside these, a sleep
    shows ``until``, a task its interaction (``task``), a child its run id (``child``)."""

    model_config = ConfigDict(extra="allow")
    n: int | None
    kind: Literal["step", "sleep", "wait", "signal", "child", "task", "now", "uuid", "patch"]
    name: str | None
    at: str | None


class StepResult(_StepBase):
    result: object


class StepError(_StepBase):
    error: dict[str, object]


Step = StepError | StepResult


class RunSummary(BaseModel):
    name: str
    id: str
    status: Status
    args: object
    result: object
    error: RunError | None
    waiting_for: dict[str, object] | None
    created_at: str | None
    updated_at: str | None
    finished_at: str | None


class Run(RunSummary):
    steps: list[Step]


class RunList(BaseModel):
    runs: list[RunSummary]
    cursor: str | None


class WorkflowSummary(BaseModel):
    name: str
    counts: dict[str, int]


class WorkflowList(BaseModel):
    workflows: list[WorkflowSummary]


class RunsQuery(Page):
    status: Status | None = None
    cursor: MachineIdCursor | None = None


class ReadQuery(Query):
    wait_ms: int = Field(0, ge=0, le=60_000)
    """Answer when the run finishes or this wait ends."""
