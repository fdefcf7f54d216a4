"""API models of the interactions face (API.md §3)."""

from __future__ import annotations

import functools
import zoneinfo
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
from pydantic.config import JsonDict

from mainspring.core.paging import IntCursor, IntPairCursor
from mainspring.core.types import (
    DurationMs,
    JsonValue,
    KeysMatch,
    Limit,
    LongText,
    Name,
    Page,
    PositiveMs,
    Query,
    ShortText,
    Text,
    all_of,
    check_exactly_one,
    exactly_one,
    given,
    not_all,
)
from mainspring.interactions import outcomes
from mainspring.interactions.cron import CRON_PATTERN
from mainspring.store import parse_time

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


OwnerBy = Literal["user", "source", "channel"]
Priority = Annotated[StrictInt, Field(ge=-1000, le=1000)]
Weight = Annotated[StrictInt, Field(ge=1, le=10_000)]


class PerOwner(Strict):
    """Limits that hold for each owner separately, across all servers."""

    concurrency: int | None = Field(None, ge=1, le=1_000_000)
    rate_limit: RateLimit | None = None


# per_owner, fair and weights need owner_by: either it is given, or none of them is.
OWNERS_NEED_OWNER_BY: JsonDict = {"anyOf": [
    given("owner_by"),
    {"properties": {"fair": {"const": False}, "per_owner": {"type": "null"},
                    "weights": {"anyOf": [{"type": "null"}, {"type": "object", "maxProperties": 0}]}}},
]}


class OwnerSettings(Strict):
    """Priorities that age, owners, their limits and fair shares (API.md §3)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=OWNERS_NEED_OWNER_BY)

    priority_aging_ms: PositiveMs | None = None
    """A due item's effective priority grows by 1 every this many ms it waits (null: priorities do not age)."""
    owner_by: OwnerBy | None = None
    """The field that names an item's owner (null counts as the owner ``""``)."""
    per_owner: PerOwner | None = None
    fair: bool = False
    """Owners with due items take turns (weighted round robin by ``weights``)."""
    weights: Annotated[dict[Name, Weight], KeysMatch()] | None = Field(None, max_length=10_000)
    """Each named owner's share of the turns (default 1)."""

    @model_validator(mode="after")
    def _owners_need_owner_by(self) -> OwnerSettings:
        if self.owner_by is None:
            named = [k for k in ("per_owner", "weights") if getattr(self, k)] + (["fair"] if self.fair else [])
            if named:
                raise ValueError(f"{', '.join(named)} need owner_by (user, source or channel): nothing names an item's owner")
        return self


class QueueSettingsIn(RetrySettings, OwnerSettings):
    model_config = ConfigDict(extra="forbid", json_schema_extra=OWNERS_NEED_OWNER_BY)

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
    priority_aging_ms: int | None = None
    owner_by: OwnerBy | None = None
    per_owner: PerOwner = Field(default_factory=PerOwner)
    fair: bool = False
    weights: dict[str, int] = Field(default_factory=dict)
    paused: bool = False
    """A paused queue leases nothing (``POST /v1/queues/{queue}/pause``, ``…/resume``); what is leased runs on."""
    counts: dict[str, int] | None = None
    counts_estimated: list[str] | None = None
    """With ``counts``: the statuses whose count is an estimate (ready and scheduled, when a queue has very
    many of both on PostgreSQL); every other count is exact."""


def _time_of(value: str | datetime | None) -> int | None:
    return None if value is None else parse_time(value)


ONE_TIME_AT_MOST = not_all(given("process_at"), given("process_in_ms"))


class When(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra=ONE_TIME_AT_MOST)

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
    model_config = ConfigDict(extra="forbid", json_schema_extra=all_of(
        ONE_TIME_AT_MOST,
        # A completed interaction is not scheduled.
        not_all({"required": ["completed"], "properties": {"completed": {"const": True}}},
                {"anyOf": [given("process_at"), given("process_in_ms")]}),
    ))

    data: JsonValue = None
    parent_id: Id | None = None
    name: Name | None = None
    message_id: Name | None = None
    channel: Name | None = None
    user: Name | None = None
    source: Name | None = None
    priority: Priority = 0
    """Higher first (−1000..1000); with the queue's ``priority_aging_ms``, waiting raises it."""
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
    model_config = ConfigDict(extra="forbid", json_schema_extra=exactly_one("process_at", "process_in_ms"))

    @model_validator(mode="after")
    def _needs_a_time(self) -> ScheduleIn:
        check_exactly_one(self, "process_at", "process_in_ms")
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
    priority: int = 0
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
    model_config = ConfigDict(extra="forbid", json_schema_extra=exactly_one("at", "in_ms"))

    at: datetime | None = None
    in_ms: DurationMs | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> _RepeatBody:
        check_exactly_one(self, "at", "in_ms")
        return self


class _WaitBody(Strict):
    pass


OUTCOMES = ("complete", "fail", "repeat", "wait", "retry")


class OutcomeIn(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra=exactly_one(*OUTCOMES))

    complete: _CompleteBody | None = None
    fail: _ErrorBody | None = None
    repeat: _RepeatBody | None = None
    wait: _WaitBody | None = None
    retry: _ErrorBody | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> OutcomeIn:
        check_exactly_one(self, *OUTCOMES)
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


class LeaseRef(Strict):
    id: ItemId
    token: Token


class HeartbeatManyIn(Strict):
    leases: Annotated[list[LeaseRef], Field(min_length=1, max_length=1000)]
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
    releases: Annotated[list[ReleaseOneIn], Field(min_length=1, max_length=1000)]


class ReleaseManyOut(BaseModel):
    released: list[str]
    """The ids whose outcome was stored."""
    lease_lost: list[str]
    """The ids not held with their token (finished, leased again, unknown or of another queue): unchanged."""


@functools.cache
def time_zones() -> frozenset[str]:
    """The IANA time zones this server knows (read once: listing them walks the tz database)."""
    return frozenset(zoneinfo.available_timezones())


def _known_zone(name: str) -> str:
    if name not in time_zones():
        raise ValueError("not an IANA time zone name this server knows")
    return name


def _zones_enum(schema: dict[str, object]) -> None:
    schema["enum"] = sorted(time_zones())


class PeriodicIn(Strict):
    cron: Annotated[str, StringConstraints(pattern=CRON_PATTERN)]
    """A cron expression: minute, hour, day of month, month, day of week, one space apart; each field ``*``,
    ``*/step`` or a comma list of numbers, ranges ``a-b`` and ``a-b/step`` (months and week days also by
    name: ``JAN``, ``MON``). A day of month over 29 needs every month (``*``)."""
    queue: Name
    data: JsonValue = None
    """The ``data`` of every interaction a tick creates."""
    timezone: Annotated[str, AfterValidator(_known_zone), Field(json_schema_extra=_zones_enum)] = "UTC"
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


_STATUS = "(?:scheduled|ready|processing|waiting|completed|failed|cancelled)"


class ListQuery(Page):
    cursor: IntCursor | None = None
    message_id: Name | None = None
    status: str | None = Field(None, max_length=200, pattern=rf"^{_STATUS}?(?:,{_STATUS}?)*$")
    """Comma-separated statuses."""
    channel: Name | None = None
    user: Name | None = None
    source: Name | None = None


class ReadQuery(Query):
    wait_ms: DurationMs = 0
    """Answer as soon as the interaction is finished, or when this wait is over."""


class ChildrenQuery(Page):
    cursor: IntPairCursor | None = None
    name: Name | None = None


class LatestChildQuery(Query):
    name: Name | None = None
