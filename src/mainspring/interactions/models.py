"""API models of the interactions face (API.md §3)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StringConstraints,
    model_validator,
)

from mainspring.core.types import DurationMs, Limit, LongText, Name, Page, PositiveMs, Query
from mainspring.core.types import JsonValue as CoreJsonValue
from mainspring.core.types import ShortText as CoreShortText
from mainspring.core.types import Text as CoreText
from mainspring.interactions import outcomes
from mainspring.store import parse_time


def _storable(value: Any) -> Any:
    """Values both engines store and every client can read back as JSON: finite numbers, and text
    without lone surrogates (which UTF-8 cannot encode)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("numbers must be finite (no NaN or Infinity)")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError("text must be valid UTF-8 (no lone surrogates)") from exc
    elif isinstance(value, dict):
        for key, item in value.items():
            _storable(key)
            _storable(item)
    elif isinstance(value, list):
        for item in value:
            _storable(item)
    return value


# The core's types, plus what PostgreSQL's jsonb and the JSON encoder refuse (tell the lead: belongs in core).
JsonValue = Annotated[CoreJsonValue, AfterValidator(_storable)]
Text = Annotated[CoreText, AfterValidator(_storable)]
ShortText = Annotated[CoreShortText, AfterValidator(_storable)]
Token = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
Id = Annotated[str, StringConstraints(max_length=40)] | StrictInt


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RateLimit(Strict):
    count: int = Field(ge=1, le=1_000_000)
    per_ms: PositiveMs


Backoff = Literal["fixed", "exponential"]


class RetrySettings(Strict):
    """How a queue delays the retry of a failed attempt (API.md §3); unset: the server's defaults."""

    backoff: Backoff | None = None
    """``fixed``: every retry waits ``error_delay_ms``; ``exponential``: the n-th waits
    ``min(error_delay_ms × 2^(n−1), max_delay_ms)``."""
    max_delay_ms: DurationMs | None = None
    """The longest an exponential backoff waits."""
    jitter: bool | None = None
    """Each delay is drawn uniformly between 0 and the backoff's, so items that failed together spread out."""


class QueueSettingsIn(RetrySettings):
    rate_limit: RateLimit | None = None
    concurrency: int | None = Field(None, ge=1, le=1_000_000)
    lease_ms: PositiveMs | None = None
    error_delay_ms: DurationMs | None = None
    max_attempts: int | None = Field(None, ge=1, le=1_000_000)
    processing_timeout_ms: PositiveMs | None = None
    retention_ms: DurationMs | None = None
    """Finished items older than this are deleted (null: kept)."""


class QueueOut(BaseModel):
    name: str
    rate_limit: RateLimit | None
    concurrency: int | None
    lease_ms: int
    error_delay_ms: int
    max_attempts: int
    processing_timeout_ms: int | None
    retention_ms: int | None
    backoff: Backoff = "fixed"
    max_delay_ms: int = 3_600_000
    jitter: bool = False
    paused: bool = False
    """A paused queue leases nothing (``POST /v1/queues/{queue}/pause``, ``…/resume``); what is leased runs on."""
    counts: dict[str, int] | None = None
    counts_estimated: list[str] | None = None
    """With ``counts``: the statuses whose count is an estimate (ready and scheduled, when a queue has very
    many of both on PostgreSQL); every other count is exact."""


def _time_of(value: str | datetime | None) -> int | None:
    return None if value is None else parse_time(value)


class When(Strict):
    process_at: datetime | None = None
    process_in_ms: DurationMs | None = None

    @model_validator(mode="after")
    def _one_of(self) -> When:
        if self.process_at is not None and self.process_in_ms is not None:
            raise ValueError("give process_at or process_in_ms, not both")
        return self

    def due_at(self, now: int) -> int | None:
        """Epoch ms this asks for, or None when neither is given."""
        if self.process_at is not None:
            return _time_of(self.process_at)
        if self.process_in_ms is not None:
            return now + self.process_in_ms
        return None


class CreateIn(When):
    data: JsonValue = None
    parent_id: Id | None = None
    name: Name | None = None
    message_id: Name | None = None
    channel: Name | None = None
    user: Name | None = None
    source: Name | None = None
    completed: bool = False
    result: JsonValue = None

    @model_validator(mode="after")
    def _completed_is_not_scheduled(self) -> CreateIn:
        if self.completed and (self.process_at is not None or self.process_in_ms is not None):
            raise ValueError("a completed interaction cannot be scheduled")
        return self


class BulkCreateIn(Strict):
    interactions: list[CreateIn] = Field(min_length=1, max_length=10_000)


class ScheduleIn(When):
    @model_validator(mode="after")
    def _needs_a_time(self) -> ScheduleIn:
        if self.process_at is None and self.process_in_ms is None:
            raise ValueError("give process_at or process_in_ms")
        return self


class RetryIn(Strict):
    process_in_ms: DurationMs | None = None
    """Run again this long from now (default: at once)."""


class ChangeIn(Strict):
    data: JsonValue
    """The new ``data``; it replaces the old one whole."""


class CompleteIn(Strict):
    result: JsonValue = None


class FailIn(Strict):
    error: Text


class Lease(BaseModel):
    token: str
    expires_at: str


class ErrorDetail(BaseModel):
    type: str
    message: str
    traceback: str


class Interaction(BaseModel):
    """An interaction as the API answers it, and as a ``@app.queue`` handler receives it."""

    id: str
    queue: str
    parent_id: str | None
    name: str | None
    message_id: str | None
    channel: str | None
    user: str | None
    source: str | None
    data: Any
    result: Any
    error: str | None
    error_detail: ErrorDetail | None = None
    """What a Python handler raised, when it raised (type, message, traceback)."""
    status: str
    next_processing: str | None
    attempts: int
    created_at: str
    updated_at: str
    lease: Lease | None = None
    trace_parent: str | None = None
    """The W3C ``traceparent`` of the request that created it, when the server traces."""


class InteractionList(BaseModel):
    interactions: list[Interaction]
    next_cursor: str | None = None


class LeaseIn(Strict):
    worker: ShortText
    max: Limit = 1
    lease_ms: PositiveMs | None = None
    wait_ms: DurationMs = 0


class HeartbeatIn(Strict):
    token: Token
    lease_ms: PositiveMs | None = None


class HeartbeatOut(BaseModel):
    expires_at: str


class _CompleteBody(Strict):
    result: JsonValue = None


class ErrorDetailIn(Strict):
    """What a Python handler raised, as a worker over HTTP sends it with a ``fail`` or ``retry`` outcome."""

    type: ShortText
    message: Text
    traceback: LongText


class _ErrorBody(Strict):
    error: Text
    error_detail: ErrorDetailIn | None = None
    """When a Python handler raised: kept with the item, as a worker beside the store does."""


class _RepeatBody(Strict):
    at: datetime | None = None
    in_ms: DurationMs | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> _RepeatBody:
        if (self.at is None) == (self.in_ms is None):
            raise ValueError("repeat needs exactly one of at or in_ms")
        return self


class _WaitBody(Strict):
    pass


class OutcomeIn(Strict):
    complete: _CompleteBody | None = None
    fail: _ErrorBody | None = None
    repeat: _RepeatBody | None = None
    wait: _WaitBody | None = None
    retry: _ErrorBody | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> OutcomeIn:
        given = [k for k in ("complete", "fail", "repeat", "wait", "retry") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("an outcome is exactly one of complete, fail, repeat, wait, retry")
        return self

    def to_outcome(self) -> outcomes.Outcome:
        if self.complete is not None:
            return outcomes.Complete(self.complete.result)
        if self.fail is not None:
            return outcomes.Fail(self.fail.error, _detail(self.fail))
        if self.repeat is not None:
            return outcomes.Repeat(at=_time_of(self.repeat.at), in_ms=self.repeat.in_ms)
        if self.retry is not None:
            return outcomes.Retry(self.retry.error, _detail(self.retry))
        return outcomes.Wait()


def _detail(body: _ErrorBody) -> dict[str, Any] | None:
    return None if body.error_detail is None else body.error_detail.model_dump()


class ReleaseIn(Strict):
    token: Token
    outcome: OutcomeIn


ItemId = Annotated[str, StringConstraints(min_length=1, max_length=32)]


def _distinct_ids(entries: list[Any]) -> list[Any]:
    ids = [e.id for e in entries]
    if len(set(ids)) != len(ids):
        raise ValueError("each interaction may appear once")
    return entries


class LeaseRef(Strict):
    id: ItemId
    token: Token


class HeartbeatManyIn(Strict):
    leases: Annotated[list[LeaseRef], Field(min_length=1, max_length=1000), AfterValidator(_distinct_ids)]
    lease_ms: PositiveMs | None = None


class HeartbeatManyOut(BaseModel):
    held: list[str]
    """The ids whose leases were extended."""
    lease_lost: list[str]
    """The ids not held with their token (finished, leased again, unknown or of another queue): unchanged."""


class ReleaseOneIn(Strict):
    id: ItemId
    token: Token
    outcome: OutcomeIn


class ReleaseManyIn(Strict):
    releases: Annotated[list[ReleaseOneIn], Field(min_length=1, max_length=1000), AfterValidator(_distinct_ids)]


class ReleaseManyOut(BaseModel):
    released: list[str]
    """The ids whose outcome was stored."""
    lease_lost: list[str]
    """The ids not held with their token (finished, leased again, unknown or of another queue): unchanged."""


class PeriodicIn(Strict):
    cron: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    """A cron expression (five fields; ``@hourly`` and friends too)."""
    queue: Name
    data: JsonValue = None
    """The ``data`` of every interaction a tick creates."""
    timezone: Annotated[str, StringConstraints(min_length=1, max_length=64)] = "UTC"
    catch_up_ms: DurationMs = 3_600_000
    """Ticks missed while no server ran are created up to this far back; older ones are skipped."""


class Periodic(BaseModel):
    name: str
    cron: str
    timezone: str
    queue: str
    data: Any
    catch_up_ms: int
    next_tick: str
    source: str
    """``app`` (``@app.periodic``) or ``api``."""
    created_at: str
    updated_at: str


class PeriodicList(BaseModel):
    periodic: list[Periodic]
    next_cursor: str | None = None


class ListQuery(Page):
    message_id: Name | None = None
    status: str | None = Field(None, max_length=200)
    """Comma-separated statuses."""
    channel: Name | None = None
    user: Name | None = None
    source: Name | None = None


class ReadQuery(Query):
    wait_ms: DurationMs = 0
    """Answer as soon as the interaction is finished, or when this wait is over."""


class ChildrenQuery(Page):
    name: Name | None = None


class LatestChildQuery(Query):
    name: Name | None = None
