"""Processors: the user's business logic, remote over HTTP or in-process Python, behind one interface.

The HTTP protocol (API.md §2): the server POSTs ``{"kind", "args", "machine"}`` and expects
``200 {"events", "aux_state"?, "action"?: {"timer"?, "remove"?}, "response"?}``. A connection error, a
timeout or a 5xx is transient; ``422`` with code ``unprocessable`` is permanent.

In-process, the same answer is a dict returned by the user's code (or None: nothing to do). The target is
either an object (or class) with any of the methods ``init``, ``call``, ``timeout``, ``notification``,
``repair`` — each ``(args, machine)`` — or one function ``(kind, args, machine)``; async or sync.
Raising :class:`Unprocessable` is the permanent error; any other exception is transient.

Remote processors, JSON or Thrift, are reached through one :class:`HttpTransport` per server: an aiohttp
connection pool. aiohttp was chosen by measurement (``bench/processor_clients.py``, 64 calls in flight to a
no-op processor on the same machine): about 0.1 ms of this process's CPU per call, where httpx and httpcore
spent about 2 ms each (their pool re-scans every connection per request, and sniffs the async library per call).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import math
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypedDict, cast, runtime_checkable

import msgspec

from mainspring.core import tracing
from mainspring.machines.settings import HistoryRange
from mainspring.store import parse_time
from mainspring.types import JsonData

if TYPE_CHECKING:
    import aiohttp

    from mainspring.core.runtime import Context
    from mainspring.machines.data import MachineRow

KINDS = ("init", "call", "timeout", "notification", "repair")


class _Unset(enum.Enum):
    # An enum of one member, so that ``x is UNSET`` narrows ``x``'s type.
    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset.UNSET
"""A field the processor left out: aux state or timer unchanged."""


class Unprocessable(Exception):
    """Raised by a processor: this request can never succeed, so the machine turns failed at once."""


@dataclass
class ProcessorError(Exception):
    """A processor call that did not give an answer."""

    detail: str
    permanent: bool = False
    timeout: bool = False
    refusal: JsonData | Literal[_Unset.UNSET] = UNSET
    """What a processor said when it refused a repair on purpose (Machinegun's ``RepairFailed.reason``)."""

    def __str__(self) -> str:
        return self.detail

    @property
    def code(self) -> str:
        if self.permanent:
            return "processor_refused"
        return "processor_timeout" if self.timeout else "processor_failed"


@dataclass
class Answer:
    """One processor answer, validated."""

    events: list[JsonData] = field(default_factory=list)
    aux_state: JsonData | Literal[_Unset.UNSET] = UNSET
    timer_at: int | Literal[_Unset.UNSET] | None = UNSET
    """UNSET: unchanged; None: unset; int: epoch ms."""
    remove: bool = False
    response: JsonData = None
    timer_range: HistoryRange | None = None
    """The history the new timer's ``timeout`` step is sent (None: the namespace's range)."""
    timer_timeout_ms: int | None = None
    """How long the new timer's ``timeout`` step may take (None: the namespace's timeout)."""


@dataclass(frozen=True)
class Step:
    """What a processor call is about beyond the machine's view: the range its history was read with, and
    the machine's timer. The JSON protocol does not send it; Machinegun's does (``Machine.history_range``,
    ``Machine.timer``)."""

    history: HistoryRange
    timer_at: int | None = None
    origin: Origin | None = None
    """Who asked for this step, when a client did (None: a timer, a notification, the JSON API)."""


@dataclass(frozen=True)
class Origin:
    """A step a woody client asked for: its ``woody.deadline`` bounds the step (nothing is written after it),
    and ``headers`` go on to the processor (the caller's ``woody.trace-id`` and ``woody.span-id``, which
    becomes the processor call's parent, and every ``woody.meta.*``), as Machinegun carries them."""

    deadline_ms: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class Driver(Protocol):
    """An in-process processor that advances its machines itself (the workflows layer's runs): a due machine
    of its namespace is leased by the background loop as any other, then handed over with its lease
    (``machine.lease_token``) instead of being sent a ``timeout`` or ``notification``. ``drive`` answers at once;
    the driver reads what it needs, applies its own version-fenced steps, and ends or keeps the lease."""

    async def drive(self, ctx: Context, machine: MachineRow) -> None: ...


class HistoryEvent(TypedDict):
    """One event of a machine's history, as the API and the processors see it."""

    id: int
    created_at: str | None
    data: JsonData


class ProcessorView(TypedDict):
    """The machine as a processor is sent it."""

    namespace: str
    id: str
    status: str
    history: list[HistoryEvent]
    aux_state: JsonData


class Processor(Protocol):
    async def process(self, kind: str, args: JsonData, machine: ProcessorView, timeout_ms: int, now_ms: int, *, step: Step | None = None) -> Answer: ...


def parse_answer(body: object, now_ms: int) -> Answer:
    """A processor's JSON answer → Answer; a malformed one is a permanent error (a bug in the processor)."""
    if body is None:
        return Answer()
    if not isinstance(body, dict):
        raise ProcessorError("the processor answered something other than a JSON object", permanent=True)
    events = body.get("events", [])
    if not isinstance(events, list):
        raise ProcessorError("the processor's `events` is not a list", permanent=True)
    answer = Answer(events=events, aux_state=body["aux_state"] if "aux_state" in body else UNSET, response=body.get("response"))
    action = body.get("action")
    if action is None:
        return answer
    if not isinstance(action, dict):
        raise ProcessorError("the processor's `action` is not an object", permanent=True)
    answer.remove = bool(action.get("remove", False))
    if "timer" in action:
        timer = action["timer"]
        try:
            if timer is None:
                answer.timer_at = None
            elif isinstance(timer, dict) and "in_ms" in timer:
                in_ms = int(timer["in_ms"])
                if in_ms < 0:
                    raise ValueError("in_ms is negative")
                answer.timer_at = now_ms + in_ms
            elif isinstance(timer, dict) and "at" in timer:
                at = timer["at"]
                answer.timer_at = int(at) if isinstance(at, int) else parse_time(str(at))
            else:
                raise ValueError("timer needs in_ms or at")
        except (TypeError, ValueError) as exc:
            raise ProcessorError(f"the processor's timer is invalid: {exc}", permanent=True) from exc
    return answer


def request_body(kind: str, args: JsonData, machine: ProcessorView) -> dict[str, object]:
    return {"kind": kind, "args": args, "machine": machine}


@dataclass(frozen=True, slots=True)
class Reply:
    """A processor's HTTP answer, read whole."""

    status_code: int
    headers: Mapping[str, str]
    """Case-insensitive, as received."""
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> JsonData:
        """The body as JSON; ValueError when it is not."""
        return _decode(self.content)  # type: ignore[no-any-return]


class HttpTransport:
    """The connections of one server to its HTTP processors: a pool of kept-alive connections, at most
    ``connections`` at once (a call beyond them waits for one, within its timeout). Opened at the first call,
    in the running event loop; closed with :meth:`aclose`."""

    def __init__(self, connections: int) -> None:
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._failures: tuple[type[BaseException], ...] = (OSError,)
        self._proxies: dict[str, str | None] = {}

    def _open(self) -> aiohttp.ClientSession:
        import aiohttp  # here, not at the top: code that only imports Unprocessable need not load it

        connector = aiohttp.TCPConnector(limit=self.connections, limit_per_host=0)
        # Processors' cookies are not the server's to keep. No timeouts of aiohttp's own: each call has its
        # deadline on its task (aiohttp's timer context costs more per request, and bounds the same).
        self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout())
        self._failures = (aiohttp.ClientError, OSError)
        return self._session

    def _proxy(self, url: str) -> str | None:
        """The proxy the environment names for ``url`` (``HTTP_PROXY``, ``NO_PROXY``…), looked up once per URL:
        aiohttp's ``trust_env`` would read the environment and ``~/.netrc`` (in a thread) on every call."""
        if url not in self._proxies:
            if len(self._proxies) > 1000:
                self._proxies.clear()
            parts = urllib.parse.urlsplit(url)
            bypass = not parts.hostname or urllib.request.proxy_bypass(parts.hostname)
            self._proxies[url] = None if bypass else urllib.request.getproxies().get(parts.scheme)
        return self._proxies[url]

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_ms: int) -> Reply:
        """POST ``body`` and read the whole answer within ``timeout_ms`` (connecting and waiting for a free
        connection included). No answer in time: a ``timeout`` ProcessorError; not reached or cut off: a
        transient one."""
        session = self._session or self._open()
        sent = dict(headers)  # gets the span's traceparent when tracing is on
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                with tracing.outgoing("POST", url, sent) as span:
                    async with session.post(url, data=body, headers=sent, proxy=self._proxy(url)) as reply:
                        if span is not None:
                            span.set_attribute("http.response.status_code", reply.status)
                        return Reply(reply.status, reply.headers, await reply.read())
        except TimeoutError as exc:
            raise ProcessorError(f"no answer from {url} within {timeout_ms} ms", timeout=True) from exc
        except self._failures as exc:
            raise ProcessorError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from exc

    @property
    def open(self) -> bool:
        """Whether connections may be open (a call was made since the pool was created or closed)."""
        return self._session is not None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


JSON_HEADERS = {"content-type": "application/json", "accept": "application/json"}

# msgspec, not the standard library: a step's request (the machine with its history) and its answer are
# encoded and decoded on every call, and msgspec does it in a fraction of ``json``'s CPU (bench/history/
# 2026-11-29-calls5.md). Its errors are ValueErrors, as ``json``'s are.
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def encode_request(kind: str, args: JsonData, machine: ProcessorView) -> bytes:
    """The processor request's body: compact UTF-8 JSON. Arguments with a float JSON cannot carry (NaN, ±inf)
    are refused (ValueError), as ``json.dumps(allow_nan=False)`` refused them: msgspec would send null. (The
    history and aux state were written as JSON before, so only the arguments are looked at.)"""
    if _has_nonfinite(args):
        raise ValueError("Out of range float values are not JSON compliant")
    return _encode(request_body(kind, args, machine))


def _has_nonfinite(value: object) -> bool:
    stack = [value]
    while stack:
        value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return True
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


class HttpProcessor:
    """A processor behind a URL."""

    def __init__(self, url: str, transport: HttpTransport) -> None:
        self.url = url
        self.transport = transport

    async def process(self, kind: str, args: JsonData, machine: ProcessorView, timeout_ms: int, now_ms: int, *, step: Step | None = None) -> Answer:
        body = encode_request(kind, args, machine)
        reply = await self.transport.post(self.url, body, JSON_HEADERS, timeout_ms)
        if reply.status_code == 422 and _problem_code(reply) == "unprocessable":
            raise ProcessorError(f"the processor refused: {_detail(reply)}", permanent=True)
        if reply.status_code != 200:
            # Only 422 unprocessable is declared permanent; anything else may heal (a deploy, a restart).
            raise ProcessorError(f"the processor answered {reply.status_code}: {_detail(reply)}")
        try:
            answer = reply.json()
        except ValueError as exc:
            raise ProcessorError("the processor's answer is not JSON", permanent=True) from exc
        return parse_answer(answer, now_ms)


def _problem_code(reply: Reply) -> JsonData:
    try:
        body = reply.json()
    except ValueError:
        return None
    return body.get("code") if isinstance(body, dict) else None


def _detail(reply: Reply) -> str:
    try:
        body = reply.json()
        if isinstance(body, dict) and body.get("detail"):
            return str(body["detail"])[:500]
    except ValueError:
        pass
    return reply.text[:500]


class LocalProcessor:
    """A Python processor in this process: an object with per-kind methods or one function."""

    def __init__(self, target: object) -> None:
        if inspect.isclass(target):
            target = target()
        self.target = target
        self.methods = {k: getattr(target, k) for k in KINDS if callable(getattr(target, k, None))}
        if not self.methods and not callable(target):
            raise TypeError(f"{target!r} is neither a processor object nor a function")
        # Asked once, not on every step (inspect's check is a few attribute reads and a flag test each time).
        self.awaited = {kind: _is_async(self.methods.get(kind, target)) for kind in KINDS}

    async def invoke(self, kind: str, args: JsonData, machine: ProcessorView) -> object:
        """Run the user's code for ``kind``; what it returns or raises, unchanged."""
        if self.methods:
            method = self.methods.get(kind)
            if method is None:
                return None  # A kind the processor does not handle: no change.
            return await (method(args, machine) if self.awaited[kind] else _run_sync(method, args, machine))
        # Callable (checked when made), async or not (``awaited``): what it returns is the user's.
        function = cast(Callable[..., Any], self.target)
        return await (function(kind, args, machine) if self.awaited[kind] else _run_sync(function, kind, args, machine))

    async def process(self, kind: str, args: JsonData, machine: ProcessorView, timeout_ms: int, now_ms: int, *, step: Step | None = None) -> Answer:
        try:
            # A deadline on this task, not wait_for's: that starts another task for every step.
            async with asyncio.timeout(timeout_ms / 1000):
                body = await self.invoke(kind, args, machine)
        except TimeoutError as exc:
            raise ProcessorError(f"the processor did not answer within {timeout_ms} ms", timeout=True) from exc
        except Unprocessable as exc:
            raise ProcessorError(f"the processor refused: {exc}", permanent=True) from exc
        except ProcessorError:
            raise
        except Exception as exc:
            raise ProcessorError(f"the processor raised {type(exc).__name__}: {exc}") from exc
        return parse_answer(body, now_ms)


def _is_async(function: object) -> bool:
    """An ``async def`` function or method, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(type(function).__call__)


async def _run_sync(function: Callable[..., object], *args: object) -> object:
    """A plain function, in a thread (it may block); an awaitable it returns is awaited here."""
    result = await asyncio.to_thread(functools.partial(function, *args))
    if inspect.isawaitable(result):
        return await result
    return result
