"""API models of the machines face."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from mainspring.core.paging import MachineIdCursor
from mainspring.core.types import JsonValue, Page, PositiveMs, Query
from mainspring.machines.settings import (
    HistoryRange,
    ModernizerConfig,
    ProcessorConfig,
    RetryPolicies,
    RetryPolicy,
)

MAX_NAME_BYTES = 1024
"""The longest namespace or machine id, in UTF-8 bytes."""


def check_machine_name(value: str) -> str:
    """A namespace or machine id as Machinegun allows them: any non-empty text up to ``MAX_NAME_BYTES``
    bytes of UTF-8 (fistful uses ``ff/withdrawal/session_v2`` and ``<id>/<sub-id>``), without NUL, which
    PostgreSQL cannot store. ValueError says why not."""
    if not value:
        raise ValueError("must not be empty")
    if "\x00" in value:
        raise ValueError("must not hold NUL")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid Unicode (no lone surrogates)") from exc
    if size > MAX_NAME_BYTES:
        raise ValueError(f"is {size} bytes of UTF-8; at most {MAX_NAME_BYTES}")
    return value


# The description shows the NUL rule as a pattern; ``check_machine_name`` checks it with the byte length.
MachineName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_BYTES, json_schema_extra={"pattern": r"^[^\x00]+$"}),
                        AfterValidator(check_machine_name)]
"""A namespace or machine id in a path (percent-encoded: ``ff%2Fidentity``) or a body."""


class NamespaceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    processor: ProcessorConfig = ProcessorConfig()
    retry: RetryPolicy = RetryPolicy()
    history: HistoryRange = HistoryRange()
    retries: RetryPolicies = RetryPolicies()
    modernizer: ModernizerConfig | None = None


class StartIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: MachineName
    args: JsonValue = None


class CallIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    args: JsonValue = None
    timeout_ms: PositiveMs | None = Field(None, le=3_600_000)
    """This call's deadline for the processor, instead of the namespace's."""


class NotifyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    args: JsonValue = None


class RepairIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    args: JsonValue = None
    simple: bool = False


class HistoryEvent(BaseModel):
    id: int
    created_at: str
    data: object


class FailureEntry(BaseModel):
    at: str
    kind: str
    code: str
    detail: str
    permanent: bool
    attempt: int
    outcome: str


class MachineSummary(BaseModel):
    namespace: str
    id: str
    status: Literal["working", "failed", "removed"]
    version: int | None = None
    last_event_id: int | None = None
    aux_state: object = None
    timer: str | None = None
    error: object = None
    created_at: str | None = None
    updated_at: str | None = None


class Machine(MachineSummary):
    history: list[HistoryEvent]
    pending_notifications: int = 0
    failures: list[FailureEntry] = []


class MachineList(BaseModel):
    machines: list[MachineSummary]
    next_cursor: str | None


class CallOut(BaseModel):
    response: object


class NotifyOut(BaseModel):
    id: str


class Operation(BaseModel):
    key: str
    kind: str
    status: int
    response: object
    created_at: str


class NamespaceOut(BaseModel):
    name: str
    processor: ProcessorConfig
    retry: RetryPolicy
    history: HistoryRange
    retries: RetryPolicies
    modernizer: ModernizerConfig | None = None
    in_process: bool
    updated_at: str | None


class MachinesQuery(Page):
    status: Literal["working", "failed"] | None = None
    cursor: MachineIdCursor | None = None


class HistoryQuery(Query):
    after: int | None = Field(None, ge=0)
    """Only the events after this event id."""
    limit: int | None = Field(None, ge=1, le=100_000)
    direction: Literal["forward", "backward"] = "forward"
