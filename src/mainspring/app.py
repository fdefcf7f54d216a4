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

import functools
import importlib
import inspect
import os
import sys
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypedDict,
    TypeVar,
    Unpack,
)

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from mainspring.core.errors import MainspringError
from mainspring.types import JsonData, JsonInput

if TYPE_CHECKING:
    from mainspring.interactions.models import Interaction

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


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


class TaskArgumentsError(MainspringError, TypeError):
    """A task's arguments do not fit its function's signature (an unknown or missing argument, a value of the
    wrong type): raised by ``defer``/``enqueue`` before anything is written."""

    status, code, title = 422, "invalid_task_arguments", "Invalid task arguments"


class NoSender(MainspringError):
    """A task was deferred or enqueued with nothing to send it through: ``app.use(…)`` (or ``.using(…)``) names
    a producer or a client."""

    status, code, title = 400, "no_sender", "Nothing to send the task through"


class AsyncSender(Protocol):
    """What ``enqueue`` writes through: a ``mainspring.producer()`` or an ``AsyncInteractionsClient``."""

    # The item's fields by name (``TASK_FIELDS``), as the clients declare them: a protocol taking ``**fields``
    # would accept only senders that take any keyword, and the clients take these.
    async def create(
        self, queue: str, data: JsonInput = None, *, parent_id: str | None = None, name: str | None = None,
        message_id: str | None = None, channel: str | None = None, user: str | None = None, source: str | None = None,
        priority: int | None = None, process_at: str | None = None, process_in_ms: int | None = None,
    ) -> Mapping[str, object]: ...

    async def result(self, interaction_id: str, *, timeout_s: float | None = None) -> JsonData: ...


class SyncSender(Protocol):
    """What ``defer`` writes through: an ``InteractionsClient``."""

    def create(
        self, queue: str, data: JsonInput = None, *, parent_id: str | None = None, name: str | None = None,
        message_id: str | None = None, channel: str | None = None, user: str | None = None, source: str | None = None,
        priority: int | None = None, process_at: str | None = None, process_in_ms: int | None = None,
    ) -> Mapping[str, object]: ...

    def result(self, interaction_id: str, *, timeout_s: float | None = None) -> JsonData: ...


class Enqueued(Generic[R]):
    """A task's item, created by ``await task.enqueue(…)``: ``id``, ``item`` (as created) and its result."""

    def __init__(self, item: Mapping[str, object], sender: AsyncSender) -> None:
        self.item = dict(item)
        self.id = str(item["id"])
        self._sender = sender

    async def result(self, timeout_s: float | None = None) -> R:
        """The function's return value (as JSON brings it back) once the item is completed;
        ``InteractionFailed`` or ``InteractionCancelled`` (``mainspring.client``) when it ends otherwise,
        ``ResultTimeout`` (a ``TimeoutError``) when ``timeout_s`` passes first."""
        return typing.cast(R, await self._sender.result(self.id, timeout_s=timeout_s))


class Deferred(Generic[R]):
    """A task's item, created by ``task.defer(…)`` (blocking): ``id``, ``item`` and its result."""

    def __init__(self, item: Mapping[str, object], sender: SyncSender) -> None:
        self.item = dict(item)
        self.id = str(item["id"])
        self._sender = sender

    def result(self, timeout_s: float | None = None) -> R:
        """As ``Enqueued.result``, blocking."""
        return typing.cast(R, self._sender.result(self.id, timeout_s=timeout_s))


class TaskDecorator(Protocol):
    """``@app.task(…)``: a function becomes a ``Task`` of its parameters and (awaited) return type."""

    @typing.overload
    def __call__(self, function: Callable[P, Awaitable[R]]) -> Task[P, R]: ...

    @typing.overload
    def __call__(self, function: Callable[P, R]) -> Task[P, R]: ...


TASK_FIELDS = ("message_id", "priority", "process_at", "process_in_ms", "channel", "user", "source", "name", "parent_id")
"""What ``Task.configure`` may set of the item (fields of ``POST /v1/queues/{queue}/interactions``)."""


class QueueKwargs(TypedDict, total=False):
    """What ``App.task`` passes on to ``App.queue`` (see there)."""

    concurrency: int
    lease_ms: int | None
    timeout_ms: int | None
    batch: int
    retry_for: type[Exception] | tuple[type[Exception], ...] | None
    fail_for: type[Exception] | tuple[type[Exception], ...] | None
    error_delay_ms: int | None
    backoff: Literal["fixed", "exponential"] | None
    max_delay_ms: int | None
    jitter: bool | None
    max_attempts: int | None
    priority_aging_ms: int | None
    owner_by: Literal["user", "source", "channel"] | None
    per_owner: dict[str, JsonInput] | None
    fair: bool | None
    weights: dict[str, int] | None


class Task(Generic[P, R]):
    """A function registered with ``@app.task``: its queue's handler, and a typed way to create its items.

    ``await task.enqueue(**kwargs)`` / ``task.defer(**kwargs)`` check the arguments against the function's
    signature (mypy does too), then create an item whose ``data`` holds them; a worker calls the function with
    them and completes the item with its return value. ``configure(message_id=…, priority=…, process_in_ms=…,
    connection=…)`` sets the item's fields for one call; ``using(sender)`` the producer or client it goes
    through (default: the app's, ``app.use(…)``). Calling the task calls the function itself.
    """

    def __init__(self, app: App, queue: str, function: Callable[P, Any], fields: Mapping[str, object] | None = None,
                 sender: AsyncSender | SyncSender | None = None) -> None:
        self.app = app
        self.queue = queue
        self.function = function
        self.fields = dict(fields or {})
        self.sender = sender
        self.signature = inspect.signature(function)
        functools.update_wrapper(self, function)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        return self.function(*args, **kwargs)

    def configure(self, *, connection: object = None, **fields: object) -> Task[P, R]:
        """This task with the item's fields set (``message_id``, ``priority``, ``process_at``, ``process_in_ms``,
        ``channel``, ``user``, ``source``, ``name``, ``parent_id``) and, for ``enqueue`` through a producer,
        ``connection``: created in your own open transaction (PostgreSQL)."""
        unknown = sorted(set(fields) - set(TASK_FIELDS))
        if unknown:
            raise TaskArgumentsError(f"task {self.queue!r}: configure() takes {', '.join(TASK_FIELDS)}, not {', '.join(unknown)}")
        given = {**self.fields, **fields}
        if connection is not None:
            given["connection"] = connection
        return Task(self.app, self.queue, self.function, given, self.sender)

    def using(self, sender: AsyncSender | SyncSender) -> Task[P, R]:
        """This task sent through ``sender`` (a producer, or an async or blocking interactions client)."""
        return Task(self.app, self.queue, self.function, self.fields, sender)

    def arguments(self, *args: object, **kwargs: object) -> dict[str, object]:
        """The item's ``data`` for these arguments: bound to the signature (positional ones by name), each
        value checked against its annotation. ``TaskArgumentsError`` when they do not fit."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TaskArgumentsError(f"task {self.queue!r}: {exc}") from None
        hints = _hints(self.function)
        for name, value in bound.arguments.items():
            parameter = self.signature.parameters[name]
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                raise TaskArgumentsError(f"task {self.queue!r}: *args and **kwargs cannot be sent as an item's data")
            if name in hints:
                try:
                    TypeAdapter(hints[name]).validate_python(value)
                except ValidationError as exc:
                    problem = exc.errors()[0]["msg"]
                    raise TaskArgumentsError(f"task {self.queue!r}: argument {name!r}: {problem}") from None
        return dict(bound.arguments)

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Enqueued[R]:
        """Create this task's item through the producer or async client (``app.use``, ``using``); answers it,
        with ``await .result(timeout_s=…)``."""
        data = self.arguments(*args, **kwargs)
        sender = self._sender()
        item = sender.create(self.queue, data, **self.fields)
        if not inspect.isawaitable(item):
            raise NoSender(f"task {self.queue!r}: enqueue() needs a producer or an AsyncInteractionsClient; use defer() with a blocking client")
        return Enqueued(await item, sender)

    def defer(self, *args: P.args, **kwargs: P.kwargs) -> Deferred[R]:
        """Create this task's item through a blocking ``InteractionsClient`` (``app.use``, ``using``); answers
        it, with ``.result(timeout_s=…)``."""
        data = self.arguments(*args, **kwargs)
        sender = self._sender()
        if inspect.iscoroutinefunction(sender.create):
            raise NoSender(f"task {self.queue!r}: defer() needs a blocking InteractionsClient; await enqueue() with {type(sender).__name__}")
        return Deferred(sender.create(self.queue, data, **self.fields), sender)

    def _sender(self) -> Any:
        sender = self.sender if self.sender is not None else self.app.sender
        if sender is None:
            raise NoSender(f"task {self.queue!r}: nothing to send it through: app.use(producer or client), or task.using(…)")
        if "connection" in self.fields and not _takes_a_connection(sender):
            # A client writes over HTTP in the server's transaction: it has no way into the caller's.
            raise NoSender(f"task {self.queue!r}: configure(connection=…) needs a producer (mainspring.producer), "
                           f"not {type(sender).__name__}")
        return sender

    def handler(self) -> Callable[[Interaction], object]:
        """The queue handler a worker runs: the function called with the item's data as its arguments."""
        function: Callable[..., Any] = self.function
        name = self.queue

        def arguments_of(item: Interaction) -> dict[str, object]:
            if not isinstance(item.data, dict):
                raise TaskArgumentsError(f"task {name!r}: the item's data is not an object of arguments")
            return item.data

        if inspect.iscoroutinefunction(function):
            async def run_async(item: Interaction) -> object:
                return await function(**arguments_of(item))

            return run_async

        def run(item: Interaction) -> object:
            return function(**arguments_of(item))

        return run


def _takes_a_connection(sender: AsyncSender | SyncSender) -> bool:
    """Whether ``sender.create`` can write in the caller's transaction (a producer's can; a client's cannot)."""
    return "connection" in inspect.signature(sender.create).parameters


def _hints(function: Callable[..., object]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function)
    except Exception:  # an annotation that does not resolve is not checked here (the worker's call still is)
        return {}


@dataclass
class Registration:
    """One registered handler, processor or batch worker and its options (as given)."""

    target: Any
    """The user's handler, processor or batch worker: called as its kind calls it."""
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
        self.tasks: dict[str, Task[..., object]] = {}
        self.sender: AsyncSender | SyncSender | None = None
        """What ``Task.enqueue``/``defer`` send through by default (``use``)."""

    def use(self, sender: AsyncSender | SyncSender) -> App:
        """Send this app's tasks (``@app.task``) through ``sender``: a ``mainspring.producer()`` or an
        ``AsyncInteractionsClient`` for ``await task.enqueue(…)``, an ``InteractionsClient`` for ``task.defer(…)``.
        Answers ``self``."""
        self.sender = sender
        return self

    def task(self, queue: str | None = None, **options: Unpack[QueueKwargs]) -> TaskDecorator:
        """Register the decorated function (async or sync) as a task: the handler of queue ``queue`` (default:
        the function's name; ``options`` are ``queue``'s) called with each item's ``data`` as its keyword
        arguments, completing the item with its return value. Answers a ``Task``: ``await f.enqueue(**kwargs)``,
        ``f.defer(**kwargs)``, then ``.result(timeout_s=…)``.

        ```python
        @app.task(max_attempts=3)
        async def send_email(to: str, subject: str = "hello") -> dict[str, bool]:
            return {"sent": True}

        job = await send_email.enqueue(to="ada@example.com")   # checked against the signature first
        print(await job.result(timeout_s=10))
        ```
        """

        def decorator(function: Callable[..., object]) -> Task[..., object]:
            if not callable(function):
                raise AppError(f"task {queue!r}: {function!r} is not callable")
            name = queue or str(getattr(function, "__name__", ""))
            task: Task[..., object] = Task(self, name, function)
            self.queue(name, **options)(task.handler())
            self.tasks[name] = task
            return task

        return typing.cast(TaskDecorator, decorator)

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
        per_owner: dict[str, JsonInput] | None = None,
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
        self, cron: str, *, queue: str, name: str | None = None, data: JsonInput = None, timezone: str = "UTC", catch_up_ms: int = 3_600_000
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
        self.tasks.update(other.tasks)
        return self

    def describe(self) -> str:
        """What this app registers, in one line (what ``mainspring worker`` says it runs)."""
        parts = [f"{label} {', '.join(sorted(table))}" for label, table in
                 (("queues", self.queues), ("batchers", self.batchers),
                  ("processors", {k: v for k, v in self.processors.items() if k not in self.workflows}),
                  ("periodic", self.schedules), ("workflows", self.workflows)) if table]
        return "; ".join(parts) or "nothing"

    @staticmethod
    def _register(table: dict[str, Registration], kind: str, name: str, options: dict[str, object]) -> Callable[[T], T]:
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


def _as_tuple(value: type[Exception] | tuple[type[Exception], ...] | None) -> tuple[type[Exception], ...] | None:
    """One exception class as a tuple of one, as ``except`` takes either."""
    return (value,) if isinstance(value, type) else value


def _checked(model: type[BaseModel], what: str, **given: object) -> dict[str, object]:
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
