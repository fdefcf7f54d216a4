"""``App``: the user's code that Mainspring runs — queue handlers, machine processors, batch workers.

```python
from mainspring import App, Fail, Interaction

app = App()

@app.queue("emails", concurrency=5)
async def send_email(item: Interaction) -> object:
    if not item.data.get("to"):
        return Fail("no recipient")
    return {"sent": True}
```
``mainspring serve --app module:app`` runs it inside the server; ``mainspring worker module:app`` runs its
queues and batchers in a process of their own. Options are checked when the decorator runs: an unknown
option or a value of the wrong type is an error there, and under mypy.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mainspring.core.errors import MainspringError

T = TypeVar("T")


class AppError(MainspringError):
    """``--app`` does not name a ``mainspring.App``, or a registration is invalid."""

    status, code, title = 400, "invalid_app", "Invalid app"


class RateOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    count: int = Field(ge=1, le=1_000_000)
    per_ms: int = Field(ge=1)


class PerOwnerOptions(BaseModel):
    """Limits that hold for each owner separately, on every server: ``{"concurrency": n, "rate_limit": {"count", "per_ms"}}``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    concurrency: int | None = Field(None, ge=1, le=1_000_000)
    rate_limit: RateOptions | None = None


class QueueOptions(BaseModel):
    """The options of ``@app.queue``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    concurrency: int = Field(10, ge=1, le=100_000)
    """Items this process handles at once (the queue's own ``concurrency`` setting caps all processes)."""
    lease_ms: int | None = Field(None, ge=1)
    """Lease per item (default: the queue's); heartbeats renew it three times per lease."""
    timeout_ms: int | None = Field(None, ge=1)
    """Processing timeout (default: the queue's ``processing_timeout_ms``)."""
    batch: int = Field(100, ge=1, le=10_000)
    """Most items leased in one call."""
    retry_for: tuple[type[Exception], ...] | None = None
    """Only these exceptions (and their subclasses) are retried; any other fails the item at once. Default:
    every exception is retried."""
    fail_for: tuple[type[Exception], ...] | None = None
    """These exceptions fail the item at once, even when ``retry_for`` names a base class of theirs."""
    # The queue's own settings, stored by every worker when it starts: the code wins for those it names; the
    # others keep what `PUT /v1/queues/{queue}` stored.
    error_delay_ms: int | None = Field(None, ge=0)
    backoff: Literal["fixed", "exponential"] | None = None
    max_delay_ms: int | None = Field(None, ge=0)
    jitter: bool | None = None
    max_attempts: int | None = Field(None, ge=1)
    # Priorities, owners and fair shares (API.md §3), the queue's settings too.
    priority_aging_ms: int | None = Field(None, ge=1)
    owner_by: Literal["user", "source", "channel"] | None = None
    per_owner: PerOwnerOptions | None = None
    fair: bool | None = None
    weights: dict[str, Annotated[int, Field(ge=1, le=10_000)]] | None = None

    @model_validator(mode="after")
    def _owners_need_owner_by(self) -> QueueOptions:
        if self.owner_by is None and (self.per_owner is not None or self.fair or self.weights):
            raise ValueError("per_owner, fair and weights need owner_by (user, source or channel)")
        return self


class BatcherOptions(BaseModel):
    """The options of ``@app.batcher``: how this process works on packages, and the batcher's settings
    used when the batcher is first created (stored settings win afterwards)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    concurrency: int = Field(1, ge=1, le=1_000)
    """Packages this process works on at once."""
    max_attempts: int = Field(3, ge=1)
    """A raise gives the package back to the cafe until this many attempts, then fails it."""
    lease_ms: int | None = Field(None, ge=1)
    min_size: int | None = Field(None, ge=1)
    max_size: int | None = Field(None, ge=1)
    linger_ms: int | None = Field(None, ge=0)
    max_wait_ms: int | None = Field(None, ge=0)
    group_size: int | None = Field(None, ge=1)
    incomplete_group: Literal["reject", "carry"] | None = None


@dataclass
class Registration:
    """One registered handler, processor or batch worker and its options (as given)."""

    target: Any
    options: dict[str, Any] = field(default_factory=dict)


class App:
    """The handlers, processors and batch workers of your application.

    Register with the decorators ``queue``, ``batcher`` and ``processor``; compose apps with ``include``.
    The registrations are read by the faces: ``queues``, ``batchers`` and ``processors`` map names to
    ``Registration``s.
    """

    def __init__(self) -> None:
        self.queues: dict[str, Registration] = {}
        self.processors: dict[str, Registration] = {}
        self.batchers: dict[str, Registration] = {}
        self.schedules: dict[str, Registration] = {}
        self.workflows: dict[str, Registration] = {}

    def queue(
        self,
        name: str,
        *,
        concurrency: int = 10,
        lease_ms: int | None = None,
        timeout_ms: int | None = None,
        batch: int = 100,
        retry_for: type[Exception] | tuple[type[Exception], ...] | None = None,
        fail_for: type[Exception] | tuple[type[Exception], ...] | None = None,
        error_delay_ms: int | None = None,
        backoff: Literal["fixed", "exponential"] | None = None,
        max_delay_ms: int | None = None,
        jitter: bool | None = None,
        max_attempts: int | None = None,
        priority_aging_ms: int | None = None,
        owner_by: Literal["user", "source", "channel"] | None = None,
        per_owner: dict[str, Any] | None = None,
        fair: bool | None = None,
        weights: dict[str, int] | None = None,
    ) -> Callable[[T], T]:
        """Handle the items of interaction queue ``name`` with the decorated function (async or sync).

        It is called with the ``Interaction`` (and, if it takes a second argument, a ``HandlerContext``)
        and returns an outcome (``Complete``, ``Fail``, ``Repeat``, ``Wait``, ``Retry``) or a plain value,
        which completes the item with that result. Raising means ``Retry`` — unless ``retry_for`` is given
        and does not name the exception, or ``fail_for`` does: then ``Fail``. ``error_delay_ms``,
        ``backoff``, ``max_delay_ms``, ``jitter`` and ``max_attempts`` set the queue's retry policy when a
        worker starts (the code wins over stored settings for those it names), and so do ``priority_aging_ms``, ``owner_by``, ``per_owner``
        (``{"concurrency": n, "rate_limit": {"count": n, "per_ms": ms}}``), ``fair`` and ``weights``: limits per
        owner and fair shares between owners, held across all servers. See ``QueueOptions``.
        """
        options = _checked(QueueOptions, f"queue {name!r}", concurrency=concurrency, lease_ms=lease_ms,
                           timeout_ms=timeout_ms, batch=batch, retry_for=_as_tuple(retry_for), fail_for=_as_tuple(fail_for),
                           error_delay_ms=error_delay_ms, backoff=backoff, max_delay_ms=max_delay_ms, jitter=jitter,
                           max_attempts=max_attempts, priority_aging_ms=priority_aging_ms, owner_by=owner_by, per_owner=per_owner,
                           fair=fair, weights=weights)
        return self._register(self.queues, "queue", name, options)

    def periodic(
        self, cron: str, *, queue: str, name: str | None = None, data: Any = None, timezone: str = "UTC", catch_up_ms: int = 3_600_000
    ) -> Callable[[T], T]:
        """Create one interaction in ``queue`` at every tick of ``cron`` (in ``timezone``), exactly once
        across all servers; ticks missed while no server ran are caught up to ``catch_up_ms`` back. The
        decorated function handles ``queue`` unless a handler is registered for it already.

        ```python
        @app.periodic("*/5 * * * *", queue="reports")
        async def report(item): ...
        ```
        """

        from mainspring.interactions.periodic import validate

        validate(cron, timezone)

        def decorator(target: T) -> T:
            schedule: str = name or str(getattr(target, "__name__", queue))
            if schedule in self.schedules:
                raise AppError(f"periodic schedule {schedule!r} is already registered")
            self.schedules[schedule] = Registration(
                target, {"cron": cron, "queue": queue, "data": data, "timezone": timezone, "catch_up_ms": catch_up_ms}
            )
            if queue not in self.queues:
                self.queues[queue] = Registration(target, _checked(QueueOptions, f"queue {queue!r}"))
            return target

        return decorator

    def batcher(
        self,
        name: str,
        *,
        concurrency: int = 1,
        max_attempts: int = 3,
        lease_ms: int | None = None,
        min_size: int | None = None,
        max_size: int | None = None,
        linger_ms: int | None = None,
        max_wait_ms: int | None = None,
        group_size: int | None = None,
        incomplete_group: Literal["reject", "carry"] | None = None,
    ) -> Callable[[T], T]:
        """Work on whole packages of batcher ``name`` with the decorated function (async or sync).

        It is called with a ``Package`` and returns per-task results (``{task_id: result}``) or None
        (every task done). Raising gives the package back until ``max_attempts``. See ``BatcherOptions``.
        """
        options = _checked(BatcherOptions, f"batcher {name!r}", concurrency=concurrency, max_attempts=max_attempts,
                           lease_ms=lease_ms, min_size=min_size, max_size=max_size, linger_ms=linger_ms,
                           max_wait_ms=max_wait_ms, group_size=group_size, incomplete_group=incomplete_group)
        return self._register(self.batchers, "batcher", name, options)

    def processor(self, namespace: str) -> Callable[[T], T]:
        """Process the machines of ``namespace`` in-process: a class (instantiated once), an object, or a
        function ``(kind, args, machine)``; methods may be async or sync."""
        return self._register(self.processors, "processor", namespace, {})

    def workflow(self, name: str) -> Callable[[T], T]:
        """Register the decorated ``async def f(wf: Workflow, args)`` as workflow ``name`` (API.md §5): its runs are
        the machines of namespace ``name``, each recorded call (``wf.step``, ``wf.sleep``, ``wf.wait``…) one event of
        their history. ``name``: letters, digits, ``_``, ``.``, ``-`` (up to 100, not starting with a sign)."""
        from mainspring.workflows.definition import NAME, WorkflowProcessor

        if not NAME.fullmatch(name):
            raise AppError(f"workflow {name!r}: a name is letters, digits, '_', '.' and '-' (up to 100), starting with a letter or digit")
        if name in self.workflows or name in self.processors:
            raise AppError(f"workflow {name!r} is already registered (as a workflow or a processor)")

        def decorator(target: T) -> T:
            if not callable(target):
                raise AppError(f"workflow {name!r}: {target!r} is not callable")
            self.workflows[name] = Registration(target)
            self.processors[name] = Registration(WorkflowProcessor(name))
            return target

        return decorator

    def include(self, other: App) -> App:
        """Add every registration of ``other`` to this app (a name registered in both is an error), so an
        application can be put together from the apps of its modules. Answers ``self``."""
        for mine, theirs, kind in ((self.queues, other.queues, "queue"), (self.batchers, other.batchers, "batcher"),
                                   (self.processors, other.processors, "processor"), (self.schedules, other.schedules, "schedule"),
                                   (self.workflows, other.workflows, "workflow")):
            clash = sorted(set(mine) & set(theirs))
            if clash:
                raise AppError(f"{kind} {', '.join(map(repr, clash))} is registered in both apps")
        self.queues.update(other.queues)
        self.batchers.update(other.batchers)
        self.processors.update(other.processors)
        self.schedules.update(other.schedules)
        self.workflows.update(other.workflows)
        return self

    def describe(self) -> str:
        """What this app registers, in one line (what ``mainspring worker`` says it runs)."""
        parts = [f"{label} {', '.join(sorted(table))}" for label, table in
                 (("queues", self.queues), ("batchers", self.batchers),
                  ("processors", {k: v for k, v in self.processors.items() if k not in self.workflows}),
                  ("periodic", self.schedules), ("workflows", self.workflows)) if table]
        return "; ".join(parts) or "nothing"

    @staticmethod
    def _register(table: dict[str, Registration], kind: str, name: str, options: dict[str, Any]) -> Callable[[T], T]:
        if name in table:
            raise AppError(f"{kind} {name!r} is already registered")

        def decorator(target: T) -> T:
            if not callable(target):
                raise AppError(f"{kind} {name!r}: {target!r} is not callable")
            if name in table:
                raise AppError(f"{kind} {name!r} is already registered")
            table[name] = Registration(target, options)
            return target

        return decorator


def _as_tuple(value: Any) -> Any:
    """One exception class as a tuple of one, as ``except`` takes either."""
    return (value,) if isinstance(value, type) else value


def _checked(model: type[BaseModel], what: str, **given: Any) -> dict[str, Any]:
    try:
        return model(**{k: v for k, v in given.items() if v is not None}).model_dump(exclude_none=True)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise AppError(f"{what}: {problems}") from None


def load_app(spec: str) -> App:
    """``package.module:attribute`` (attribute defaults to ``app``) → the App it names."""
    module_name, _, attribute = spec.partition(":")
    # Like uvicorn: the directory the command runs in is importable, so `--app examples.books:app` works.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise AppError(f"--app {spec}: no module named {exc.name!r} (run from the folder that holds it)") from None
        raise
    app = getattr(module, attribute or "app", None)
    if app is None:
        raise AppError(f"--app {spec}: module {module_name!r} has no attribute {attribute or 'app'!r}")
    if not isinstance(app, App):
        raise AppError(f"--app {spec} is a {type(app).__name__}, not a mainspring.App")
    return app
