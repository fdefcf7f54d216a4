"""Machinegun's ``Automaton`` service, served over woody (Thrift binary over HTTP POST).

Each method maps onto the face's service functions, so a machine started here is the same machine the JSON
API shows, with the same guarantees. What each method may throw is exactly what the IDL declares; anything
else is a woody *system* error (see ``woody``), as Machinegun answers it: a processor that is unavailable is
``503``, one that did not answer in time ``504``, a machine busy with other steps or an unreachable store is ``503`` (nothing was
done: retry), an unexpected failure is ``500``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.responses import Response
from thriftpy2.protocol.binary import TBinaryProtocol
from thriftpy2.thrift import TApplicationException, TException, TProcessor

# The pure-Python buffer and protocol: the Cython buffer spins forever on a truncated message, and these
# bytes come from the network.
from thriftpy2.transport.memory import TMemoryBuffer

from mainspring.core.auth import Principal
from mainspring.core.errors import Forbidden, MainspringError
from mainspring.core.runtime import Context
from mainspring.machines import errors, namespaces, service
from mainspring.machines.machinegun import codec, woody
from mainspring.machines.machinegun.idl import Automaton, EventSink, base, stateproc
from mainspring.machines.machinegun.modernizer import BadModernization, modernize_machine
from mainspring.machines.machinegun.sink import sink_history
from mainspring.machines.models import check_machine_name
from mainspring.machines.processor import UNSET, Origin, ProcessorError
from mainspring.machines.settings import HistoryRange
from mainspring.store.errors import is_unavailable
from mainspring.web.permissions import Decoded
from mainspring.web.routing import Call, Routes

if TYPE_CHECKING:
    from mainspring.machines.face import WithMachines
    from mainspring.machines.machinegun.codec import (
        MsgpackValue,
        ThriftHistoryRange,
        ThriftMachineDescriptor,
        ThriftMachineRef,
    )

log = logging.getLogger("mainspring.machines.machinegun")



@dataclass
class SystemError_(Exception):
    """A woody system error: the HTTP status and ``woody.error-class`` a woody client reads it by."""

    status: int
    error_class: str
    reason: str


FACE_TO_IDL: dict[type[Exception], type[Exception]] = {
    errors.NamespaceNotFound: stateproc.NamespaceNotFound,
    errors.MachineNotFound: stateproc.MachineNotFound,
    errors.MachineAlreadyExists: stateproc.MachineAlreadyExists,
    errors.MachineFailed: stateproc.MachineFailed,
    errors.MachineAlreadyWorking: stateproc.MachineAlreadyWorking,
}


@contextlib.contextmanager
def declared() -> Iterator[None]:
    """The face's errors as the IDL's exceptions. A method that does not declare one lets it through as a
    500 (``serve_automaton`` checks the method's throws), so each method throws only what it declares."""
    try:
        yield
    except tuple(FACE_TO_IDL) as exc:
        raise FACE_TO_IDL[type(exc)]() from exc
    except (errors.ProcessorFailed, errors.ProcessorTimeout, errors.ProcessorRefused) as exc:
        cause = exc.__cause__
        if isinstance(cause, ProcessorError) and cause.refusal is not UNSET:  # the processor threw RepairFailed
            raise stateproc.RepairFailed(reason=codec.value_from_json(cause.refusal)) from exc
        if isinstance(cause, ProcessorError) and cause.permanent:
            # Machinegun's word for a processor that failed the step: the machine failed (or, for Start,
            # was never created).
            raise stateproc.MachineFailed() from exc
        # A processor that did not answer: as Machinegun answers it (woody_erlang's server maps its
        # `resource_unavailable` to 503 and `result_unknown` to 504, whatever the cause).
        if isinstance(exc, errors.ProcessorTimeout):
            raise SystemError_(504, woody.RESULT_UNKNOWN, exc.detail) from exc
        raise SystemError_(503, woody.RESOURCE_UNAVAILABLE, exc.detail) from exc


class AutomatonHandler:
    """The IDL's methods (thriftpy2 calls them by name, with the IDL's argument order)."""

    def __init__(self, ctx: Context, principal: Principal, origin: Origin) -> None:
        self.ctx = ctx
        self.principal = principal
        self.origin = origin

    def _names(self, ns: Any, machine_id: Any) -> tuple[str, str]:
        for what, value in (("namespace", ns), ("machine id", machine_id)):
            if not isinstance(value, str):  # thriftpy2 hands over bytes that are not UTF-8
                raise SystemError_(400, woody.RESULT_UNEXPECTED, f"invalid {what}: not UTF-8")
            try:
                check_machine_name(value)
            except ValueError as exc:
                raise SystemError_(400, woody.RESULT_UNEXPECTED, f"invalid {what}: {exc}") from exc
        self.principal.require(f"machines:{ns}")
        return ns, machine_id

    def _descriptor(self, desc: ThriftMachineDescriptor | None) -> tuple[str, str, HistoryRange]:
        if desc is None or desc.ref is None or desc.ref.id is None:
            raise SystemError_(400, woody.RESULT_UNEXPECTED, "MachineDescriptor.ref.id is required")
        ns, machine_id = self._names(desc.ns, desc.ref.id)
        return ns, machine_id, codec.history_range(desc.range)

    def check_deadline(self) -> None:
        """A call whose ``woody.deadline`` has passed before it started is not started at all. Once started,
        the deadline bounds every method's step (``service``): the processor call gets what is left of it,
        and nothing is written after it."""
        if self.origin.deadline_ms is not None and self.origin.deadline_ms <= self.ctx.now_ms():
            raise SystemError_(503, woody.RESOURCE_UNAVAILABLE, "deadline reached")

    async def Start(self, ns: str, id: str, a: MsgpackValue) -> None:
        ns, machine_id = self._names(ns, id)
        with declared():
            await service.start_machine(self.ctx, ns, machine_id, codec.value_to_json(a), origin=self.origin)

    async def Call(self, desc: ThriftMachineDescriptor | None, a: MsgpackValue) -> MsgpackValue:
        ns, machine_id, rng = self._descriptor(desc)
        with declared():
            reply = await service.call_machine(self.ctx, ns, machine_id, codec.value_to_json(a), rng=rng, origin=self.origin)
        return codec.value_from_json(reply.body["response"])

    async def GetMachine(self, desc: ThriftMachineDescriptor | None) -> object:
        ns, machine_id, rng = self._descriptor(desc)
        with declared():
            machine = await service.get_machine(self.ctx, ns, machine_id, rng, origin=self.origin)
        # `after` past the last event is an empty history, as Machinegun answers (hellgate and machinery have
        # no clause for EventNotFound), never EventNotFound.
        return codec.machine_struct(machine, rng)

    async def Repair(self, desc: ThriftMachineDescriptor | None, a: MsgpackValue) -> MsgpackValue:
        ns, machine_id, rng = self._descriptor(desc)
        with declared():
            reply = await service.repair_machine(self.ctx, ns, machine_id, codec.value_to_json(a), rng=rng, origin=self.origin)
        return codec.value_from_json(reply.body["response"])

    async def SimpleRepair(self, ns: str, ref: ThriftMachineRef | None) -> None:
        ns, machine_id = self._names(ns, ref.id if ref is not None else None)
        with declared():
            await service.repair_machine(self.ctx, ns, machine_id, None, simple=True, origin=self.origin)

    async def Notify(self, desc: ThriftMachineDescriptor | None, a: MsgpackValue) -> object:
        ns, machine_id, rng = self._descriptor(desc)
        with declared():
            reply = await service.notify_machine(self.ctx, ns, machine_id, codec.value_to_json(a), rng=rng, origin=self.origin)
        return stateproc.NotifyResponse(id=reply.body["id"])

    async def Remove(self, ns: str, id: str) -> None:
        ns, machine_id = self._names(ns, id)
        with declared():
            # NamespaceNotFound before MachineNotFound
            await service.storage_retries(self.ctx, ns, self.origin).run(self.ctx, functools.partial(namespaces.get_namespace, self.ctx, ns))
            await service.remove_machine(self.ctx, ns, machine_id, origin=self.origin)

    async def Modernize(self, desc: ThriftMachineDescriptor | None) -> None:
        """The namespace's Modernizer rewrites the machine's outdated events in the range (``modernizer``);
        NamespaceNotFound when the namespace has none, as Machinegun."""
        ns, machine_id, rng = self._descriptor(desc)
        try:
            with declared():
                await modernize_machine(self.ctx, ns, machine_id, rng, self.origin)
        except ProcessorError as exc:  # the Modernizer's failure: nothing of the event was written
            if exc.timeout:
                raise SystemError_(504, woody.RESULT_UNKNOWN, f"modernizer: {exc.detail}") from exc
            raise SystemError_(500 if exc.permanent else 503, woody.RESULT_UNEXPECTED if exc.permanent else woody.RESOURCE_UNAVAILABLE,
                               f"modernizer: {exc.detail}") from exc
        except BadModernization as exc:
            raise SystemError_(500, woody.RESULT_UNEXPECTED, str(exc)) from exc


def _answer(status: int, body: bytes = b"", headers: dict[str, str] | None = None, trace: dict[str, str] | None = None) -> Response:
    media = woody.CONTENT_TYPE if status == 200 else None
    return Response(body, status_code=status, media_type=media, headers={**(trace or {}), **(headers or {})})


def _refused(status: int, reason: str, trace: dict[str, str] | None = None) -> Response:
    return _answer(status, headers=woody.error_headers(woody.RESULT_UNEXPECTED, reason), trace=trace)


class EventSinkHandler:
    """Machinegun's polling ``EventSink`` (retired from machinegun-proto in 2024, still served by
    machinegun-woody-api at ``/v1/event_sink``): every machine event of the sink's namespaces, oldest first,
    by outbox position (as far back as ``server.events_retention_ms`` keeps them)."""

    def __init__(self, ctx: Context, principal: Principal, origin: Origin) -> None:
        self.ctx = ctx
        self.principal = principal
        self.origin = origin

    def check_deadline(self) -> None:
        if self.origin.deadline_ms is not None and self.origin.deadline_ms <= self.ctx.now_ms():
            raise SystemError_(503, woody.RESOURCE_UNAVAILABLE, "deadline reached")

    async def GetHistory(self, event_sink_id: object, range: ThriftHistoryRange | None) -> list[object]:
        sinks = self.ctx.settings.machines.machinegun.event_sinks
        namespaces_of_sink = sinks.get(event_sink_id) if isinstance(event_sink_id, str) else None
        # A sink shows its namespaces' events; whether a sink exists is told only to whoever may read every one.
        for ns in namespaces_of_sink or ["*"]:
            self.principal.require(f"machines:{ns}")
        if namespaces_of_sink is None:
            raise stateproc.EventSinkNotFound()
        try:
            rng = codec.history_range(range)
        except codec.BadHistoryRange as exc:
            raise base.InvalidRequest(errors=[exc.detail]) from exc
        if rng.direction == "backward":
            raise base.InvalidRequest(errors=["this event sink reads forward only"])
        limit = SINK_PAGE if rng.limit is None else min(rng.limit, SINK_PAGE)
        return await sink_history(self.ctx, namespaces_of_sink, rng.after or 0, limit)


SINK_PAGE = 1000
"""The most events one GetHistory answers (a range without a limit gets this many; the next call continues)."""


async def serve_automaton(call: Call, body: bytes) -> Response:
    """One woody call of the Automaton service."""
    return await serve_woody(call, Automaton, AutomatonHandler)


async def serve_event_sink(call: Call, body: bytes) -> Response:
    """One woody call of the polling EventSink service."""
    return await serve_woody(call, EventSink, EventSinkHandler)


async def serve_woody(call: Call, service_: Any, handler_of: Callable[[Context, Principal, Origin], AutomatonHandler | EventSinkHandler]) -> Response:
    """One woody call of ``service_``: checks the transport as woody's server does, decodes the Thrift
    message, runs the method of ``handler_of(ctx, principal, origin)`` and encodes its result or declared
    exception."""
    request = call.request
    if request.headers.get("content-type", "").split(";")[0].strip() != woody.CONTENT_TYPE:
        return _refused(415, f"wrong content type: {request.headers.get('content-type')}")
    accept = request.headers.get("accept")
    if accept not in (None, woody.CONTENT_TYPE, "*/*"):
        return _refused(406, f"wrong client accept: {accept}")
    ids = {h: request.headers.get(h) for h in (woody.TRACE_ID, woody.SPAN_ID, woody.PARENT_ID)}
    if not all(ids.values()):
        return _refused(400, "bad woody id header")
    trace: dict[str, str] = {k: v for k, v in ids.items() if v}
    deadline_ms = None
    if request.headers.get(woody.DEADLINE):
        try:
            deadline_ms = woody.parse_deadline(request.headers[woody.DEADLINE])
        except ValueError:
            return _refused(400, f"bad {woody.DEADLINE} header", trace)
    body = call.body
    if not body:
        return _refused(400, "body empty", trace)
    forwarded = {k: v for k, v in request.headers.items() if k.startswith(woody.META_PREFIX)}
    handler = handler_of(call.ctx, call.principal, Origin(deadline_ms, {**trace, **forwarded}))
    processor = TProcessor(service_, handler)
    try:
        api, seqid, result, call = processor.process_in(TBinaryProtocol(TMemoryBuffer(body)))
    except Exception as exc:  # any decoding failure of a client's bytes is its bad request, not our 500
        return _refused(400, f"bad thrift message: {type(exc).__name__}: {exc}"[:300], trace)
    if isinstance(result, TApplicationException) or call is None:
        return _refused(400, f"unknown method {api!r}", trace)
    out = TMemoryBuffer()
    oprot = TBinaryProtocol(out)
    try:
        handler.check_deadline()
        result.success = await call()
    except SystemError_ as exc:
        return _answer(exc.status, headers=woody.error_headers(exc.error_class, exc.reason), trace=trace)
    except TException as exc:
        if not processor.handle_exception(exc, result):
            log.error("%s.%s raised %s, which the IDL does not declare for it", service_.__name__, api, type(exc).__name__)
            return _answer(500, headers=woody.error_headers(woody.RESULT_UNEXPECTED, f"undeclared {type(exc).__name__}"), trace=trace)
        processor.send_result(oprot, api, result, seqid)
        return _answer(200, out.getvalue(), woody.error_headers(woody.BUSINESS, type(exc).__name__), trace)
    except Forbidden as exc:
        return _refused(403, exc.detail, trace)
    except errors.MachineBusy as exc:
        return _answer(503, headers=woody.error_headers(woody.RESOURCE_UNAVAILABLE, exc.detail), trace=trace)
    except MainspringError as exc:
        # A refused request (a value with no place in the store) is the caller's 400; the store gone is 503;
        # the deadline passed during the step is 504 (the processor may have been called).
        status = 400 if exc.status < 500 else exc.status if exc.status in (503, 504) else 500
        error_class = {503: woody.RESOURCE_UNAVAILABLE, 504: woody.RESULT_UNKNOWN}.get(status, woody.RESULT_UNEXPECTED)
        return _answer(status, headers=woody.error_headers(error_class, exc.detail), trace=trace)
    except Exception as exc:
        if is_unavailable(exc):
            return _answer(503, headers=woody.error_headers(woody.RESOURCE_UNAVAILABLE, "the store is not reachable"), trace=trace)
        log.exception("%s.%s failed", service_.__name__, api)
        return _answer(500, headers=woody.error_headers(woody.RESULT_UNEXPECTED, f"{type(exc).__name__}"), trace=trace)
    processor.send_result(oprot, api, result, seqid)
    return _answer(200, out.getvalue(), trace=trace)


WOODY_ANSWERS = {
    # woody's own answers: a business error is 200 with woody.error-class; these are its system errors.
    400: "woody: a malformed request or Thrift message (Result Unexpected)",
    403: "the token may not use the machine's namespace",
    406: "woody: the client does not accept application/x-thrift",
    415: "woody: the body is not application/x-thrift",
    500: "woody: the call failed inside Mainspring (Result Unexpected)",
    503: "woody: the processor or the store is unavailable, nothing was done (Resource Unavailable)",
    504: "woody: the processor or the deadline timed out (Result Unknown)",
}


def woody_routes(settings: WithMachines, automaton_path: str, event_sink_path: str) -> Routes:
    """The Automaton and EventSink services at these paths. With ``machines.machinegun.auth = "none"``
    they take calls without a token, as Machinegun does (woody clients send none): every namespace is open
    to whoever reaches them."""
    routes = Routes("", tag="machinegun")
    public = settings.machines.machinegun.auth == "none"
    content = {woody.CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}}
    # The namespace is inside the Thrift message: the handler's decoder checks ``machines:<ns>`` per call.
    permission = Decoded("machines:<the namespace in the Thrift call>", public=public)
    routes.add("POST", automaton_path, serve_automaton, permission=permission, content=content, answers=WOODY_ANSWERS)
    routes.add("POST", event_sink_path, serve_event_sink, permission=permission, content=content, answers=WOODY_ANSWERS)
    return routes


def automaton_routes(settings: WithMachines) -> list[Routes]:
    """The services on the main server (``machines.machinegun.automaton_path`` and ``event_sink_path``)."""
    machinegun = settings.machines.machinegun
    return [woody_routes(settings, machinegun.automaton_path, machinegun.event_sink_path)]
