"""Request and response models of the batching API (API.md §4)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mainspring.core.paging import IntCursor
from mainspring.core.types import (
    DurationMs,
    JsonValue,
    KeysMatch,
    Limit,
    Name,
    Page,
    PositiveMs,
    Query,
    ShortText,
    Text,
)

DEFAULTS: dict[str, Any] = {
    "min_size": 2,
    "max_size": 6,
    "linger_ms": 5000,
    "max_wait_ms": 30000,
    "group_size": 2,
    "incomplete_group": "reject",
    "lease_ms": 60000,
}
SETTING_KEYS = tuple(DEFAULTS)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BatcherSettingsIn(Strict):
    """Fields left out keep their current value (or the default for a new batcher)."""

    min_size: int | None = Field(None, ge=1, le=100_000)
    max_size: int | None = Field(None, ge=1, le=100_000)
    linger_ms: DurationMs | None = None
    max_wait_ms: DurationMs | None = None
    group_size: int | None = Field(None, ge=1, le=1000)
    incomplete_group: Literal["reject", "carry"] | None = None
    lease_ms: PositiveMs | None = None


class BatcherCounts(BaseModel):
    pending: int = 0
    packed: int = 0
    claimed: int = 0
    done: int = 0
    failed: int = 0
    rejected: int = 0


class PackageCounts(BaseModel):
    ready: int = 0
    claimed: int = 0
    done: int = 0
    failed: int = 0


class Batcher(BaseModel):
    name: str
    min_size: int
    max_size: int
    linger_ms: int
    max_wait_ms: int
    group_size: int
    incomplete_group: str
    lease_ms: int
    linger_started_at: str | None
    linger_ends_at: str | None
    counts: BatcherCounts | None = None
    package_counts: PackageCounts | None = None
    created_at: str
    updated_at: str


class TaskIn(Strict):
    id: Name
    group: Name
    member: Name
    content: JsonValue = Field(description="The task's content; a string is hashed as UTF-8, anything else as canonical JSON.")
    data: JsonValue = None


class Task(BaseModel):
    id: str
    batcher: str
    group: str
    member: str
    sha256: str
    version: int | None
    status: Literal["pending", "packed", "claimed", "done", "failed", "rejected"]
    reason: str | None
    package_id: str | None
    reissued: bool = Field(False, description="Made by the dispatcher to complete a group whose other members did not change.")
    data: object = None
    result: object = None
    error: str | None = None
    created_at: str
    updated_at: str


class PackageTask(BaseModel):
    id: str
    group: str
    member: str
    version: int | None
    sha256: str
    content: object
    data: object = None
    status: str
    reissued: bool = False


class Lease(BaseModel):
    token: str
    expires_at: str


class Package(BaseModel):
    id: str
    batcher: str
    status: Literal["ready", "claimed", "done", "failed"]
    size: int
    worker: str | None
    attempts: int
    error: str | None
    lease: Lease | None
    tasks: list[PackageTask]
    created_at: str
    updated_at: str


class PackageList(BaseModel):
    packages: list[Package]
    next_cursor: str | None


class ClaimIn(Strict):
    worker: ShortText
    lease_ms: PositiveMs | None = None
    wait_ms: int | None = Field(None, ge=0, le=300_000)


class TaskResult(Strict):
    """One task's outcome; a task left out of ``results`` is done."""

    task_id: Name
    status: Literal["done", "failed"] = "done"
    result: JsonValue = None
    error: Text | None = None


class CompleteIn(Strict):
    token: ShortText
    results: list[TaskResult] | Annotated[dict[Name, JsonValue], KeysMatch()] | None = Field(
        None,
        description="Per-task outcomes: a list of {task_id, status, result, error}, or a map task id → result.",
    )


class FailIn(Strict):
    token: ShortText
    error: Text
    retry: bool = False


class HeartbeatIn(Strict):
    token: ShortText
    lease_ms: PositiveMs | None = None


class Version(BaseModel):
    version: int
    sha256: str
    task_id: str
    at: str
    withdrawn_at: str | None = None


class VersionList(BaseModel):
    versions: list[Version]
    next_cursor: str | None


class GroupVersions(BaseModel):
    members: dict[str, list[Version]] = Field(description="Each member's permanent log, oldest version first.")


class DeleteBatcherQuery(Query):
    force: bool = False
    """Delete even while a package of it is claimed under a live lease."""


class PackagesQuery(Page):
    cursor: IntCursor | None = None
    status: Literal["ready", "claimed", "done", "failed"] | None = None


class VersionsQuery(Page):
    cursor: IntCursor | None = None
    limit: Limit = 1000
