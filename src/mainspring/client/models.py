"""What the clients answer: the JSON objects of the HTTP contract (API.md), typed.

They are ``TypedDict``s: plain dicts at run time (``item["status"]``, ``json.dumps(item)``), checked by
mypy and shown by editors. Fields the contract marks optional, or that a newer server adds, are
``NotRequired``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

from mainspring.types import JsonData, JsonObject

# --- shared ------------------------------------------------------------------------------------------


class Lease(TypedDict):
    token: str
    expires_at: str


class Subject(TypedDict):
    kind: str
    id: str


class Event(TypedDict):
    id: str
    type: str
    at: str
    subject: Subject
    data: JsonData


class EventPage(TypedDict):
    events: list[Event]
    next_cursor: str | None


class Alert(TypedDict):
    id: str
    at: str
    severity: str
    code: str
    subject: Subject
    detail: str
    acked_at: str | None
    resolved_at: NotRequired[str | None]
    resolved_by: NotRequired[str | None]
    resolution: NotRequired[str | None]


class AlertPage(TypedDict):
    alerts: list[Alert]
    next_cursor: NotRequired[str | None]


# --- interactions (API.md §3) -------------------------------------------------------------------------


class RateLimit(TypedDict):
    count: int
    per_ms: int


class PerOwner(TypedDict, total=False):
    concurrency: int | None
    rate_limit: RateLimit | None


class Queue(TypedDict):
    name: str
    rate_limit: RateLimit | None
    concurrency: int | None
    lease_ms: int
    error_delay_ms: int
    max_attempts: int
    processing_timeout_ms: int | None
    retention_ms: NotRequired[int | None]
    backoff: NotRequired[Literal["fixed", "exponential"]]
    max_delay_ms: NotRequired[int]
    jitter: NotRequired[bool]
    priority_aging_ms: NotRequired[int | None]
    owner_by: NotRequired[Literal["user", "source", "channel"] | None]
    per_owner: NotRequired[PerOwner]
    fair: NotRequired[bool]
    weights: NotRequired[dict[str, int]]
    paused: NotRequired[bool]
    counts: NotRequired[dict[str, int] | None]


class Periodic(TypedDict):
    name: str
    cron: str
    timezone: str
    queue: str
    data: JsonData
    catch_up_ms: int
    next_tick: str
    source: str
    created_at: str
    updated_at: str


class ErrorDetail(TypedDict):
    type: str
    message: str
    traceback: str


class Interaction(TypedDict):
    id: str
    queue: str
    parent_id: str | None
    name: str | None
    message_id: str | None
    channel: str | None
    user: str | None
    source: str | None
    priority: NotRequired[int]
    data: JsonData
    result: JsonData
    error: str | None
    error_detail: NotRequired[ErrorDetail | None]
    status: str
    next_processing: str | None
    attempts: int
    created_at: str
    updated_at: str
    lease: NotRequired[Lease | None]


class InteractionPage(TypedDict):
    interactions: list[Interaction]
    next_cursor: NotRequired[str | None]


class Heartbeat(TypedDict):
    expires_at: str


class LeasesKept(TypedDict):
    """The answer of ``heartbeat_many``."""

    held: list[str]
    lease_lost: list[str]


class LeasesReleased(TypedDict):
    """The answer of ``release_many``: every released outcome is stored."""

    released: list[str]
    lease_lost: list[str]


# --- batching (API.md §4) -----------------------------------------------------------------------------


class Batcher(TypedDict):
    name: str
    min_size: int
    max_size: int
    linger_ms: int
    max_wait_ms: int
    group_size: int
    incomplete_group: str
    lease_ms: int
    linger_started_at: NotRequired[str | None]
    linger_ends_at: NotRequired[str | None]
    counts: NotRequired[dict[str, int] | None]
    package_counts: NotRequired[dict[str, int] | None]
    created_at: NotRequired[str]
    updated_at: NotRequired[str]


class Task(TypedDict):
    id: str
    batcher: str
    group: str
    member: str
    sha256: str
    version: int | None
    status: str
    reason: str | None
    package_id: str | None
    reissued: NotRequired[bool]
    data: NotRequired[JsonData]
    result: NotRequired[JsonData]
    error: NotRequired[str | None]
    created_at: str
    updated_at: str


class PackageTask(TypedDict):
    id: str
    group: str
    member: str
    version: int | None
    sha256: str
    content: JsonData
    data: JsonData
    status: NotRequired[str]
    reissued: NotRequired[bool]


class Package(TypedDict):
    id: str
    batcher: str
    status: str
    attempts: int
    tasks: list[PackageTask]
    lease: NotRequired[Lease | None]
    worker: NotRequired[str | None]
    created_at: NotRequired[str]
    updated_at: NotRequired[str]


class PackagePage(TypedDict):
    packages: list[Package]
    next_cursor: NotRequired[str | None]


class Version(TypedDict):
    version: int
    sha256: str
    task_id: str
    at: str
    withdrawn_at: NotRequired[str | None]


# --- machines (API.md §2) -----------------------------------------------------------------------------


class HistoryEvent(TypedDict):
    id: int
    created_at: str
    data: JsonData


class MachineFailure(TypedDict):
    at: str
    kind: str
    code: str
    detail: str
    permanent: bool
    attempt: int
    outcome: str


class Machine(TypedDict):
    namespace: str
    id: str
    status: str
    history: list[HistoryEvent]
    aux_state: JsonData
    timer: str | None
    error: JsonObject | None
    version: NotRequired[int]
    pending_notifications: NotRequired[int]
    failures: NotRequired[list[MachineFailure]]
    updated_at: NotRequired[str]


class StepAnswer(TypedDict):
    """What Call and Repair answer: the processor's ``response``."""

    response: JsonData


class Notified(TypedDict):
    id: str


class MachineOperation(TypedDict):
    """How the operation with an Idempotency-Key ended: the answer it gave (``response``)."""

    key: str
    kind: str
    status: int
    response: JsonObject
    created_at: str


class MachinePage(TypedDict):
    machines: list[Machine]
    next_cursor: NotRequired[str | None]


class Namespace(TypedDict):
    name: NotRequired[str]
    processor: JsonObject
    retry: NotRequired[JsonObject]
    history: NotRequired[JsonObject]


# --- exchange (API.md §1) -----------------------------------------------------------------------------


class Message(TypedDict):
    id: str
    addressee: str
    database: str
    size: int
    sha256: str
    content_type: str
    sender: str | None
    created_at: str


class Mailbox(TypedDict):
    messages: list[Message]
    busy: bool
    active_process_id: str | None


class MailboxSummary(TypedDict):
    addressee: str
    database: str
    available: int
    active_process_id: str | None


class Process(TypedDict):
    id: str
    addressee: str
    database: str
    client_id: str
    message_ids: list[str]
    state: str
    started_at: str
    deadline: str | None
    updated_at: str


class ProcessPage(TypedDict):
    processes: list[Process]
    next_cursor: NotRequired[str | None]


class ReadyAnswer(TypedDict):
    status: str
    process: Process


@dataclass
class Reply:
    """A message to publish when an exchange process commits (API_3 ``replies``)."""

    addressee: str
    database: str
    body: bytes | str
    content_type: str | None = None
    message_id: str | None = None

    def to_api(self) -> dict[str, str]:
        """The reply as API_3 takes it (bytes as ``body_base64``)."""
        item: dict[str, str] = {"addressee": self.addressee, "database": self.database}
        if isinstance(self.body, str):
            item["body"] = self.body
        else:
            item["body_base64"] = base64.b64encode(self.body).decode()
        if self.content_type:
            item["content_type"] = self.content_type
        if self.message_id:
            item["message_id"] = self.message_id
        return item


# --- workflows (API.md §5) ----------------------------------------------------------------------------


class WorkflowRun(TypedDict):
    name: str
    id: str
    status: str
    args: JsonData
    result: JsonData
    error: JsonObject | None
    waiting_for: JsonObject | None
    created_at: str | None
    updated_at: str | None
    finished_at: str | None
    steps: NotRequired[list[JsonObject]]


class WorkflowSummary(TypedDict):
    """A registered workflow with its runs counted by status."""

    name: str
    counts: dict[str, int]


class WorkflowRunPage(TypedDict):
    runs: list[WorkflowRun]
    cursor: str | None
