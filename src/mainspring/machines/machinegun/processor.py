"""Calling a processor written for Machinegun: its Thrift ``Processor`` service over woody.

A namespace with ``processor.protocol = "machinegun"`` is served by this instead of the JSON protocol; the
step machinery around it (the version guard, retries, the failure journal) is the same. The kinds map as
Machinegun's do: ``init``/``timeout``/``notification`` are ``ProcessSignal``, ``call`` is ``ProcessCall``,
``repair`` is ``ProcessRepair``. The answer's ``MachineStateChange`` and ``ComplexAction`` become an
``Answer``; Values go through ``codec``, so what is stored reads back as the same Values.

How a failure counts, following woody's error classes (what Machinegun retries and what fails a machine):

| the processor answered | counts as |
| --- | --- |
| ``503`` Resource Unavailable, a connection error | transient: nothing happened, retried by the policy |
| ``504`` Result Unknown, no answer in time, ``502`` with Result Unknown | a timeout: transient, retried |
| ``502`` Resource Unavailable | transient |
| ``500`` / ``4xx`` Result Unexpected, a Thrift message that does not decode | permanent: the machine fails |
| ``RepairFailed`` from ``ProcessRepair`` | permanent, and the caller's Repair throws RepairFailed with its reason |
"""

from __future__ import annotations

from typing import Any

from mainspring.machines.machinegun import codec, woody
from mainspring.machines.machinegun.idl import Processor as ProcessorService
from mainspring.machines.machinegun.idl import stateproc
from mainspring.machines.processor import UNSET, Answer, HttpTransport, ProcessorError, ProcessorView, Step
from mainspring.machines.settings import HistoryRange
from mainspring.store import format_time, parse_time
from mainspring.types import JsonData

TRANSIENT = {503, 502}
"""woody statuses that say nothing was done (502 is decided by its error class, below)."""


class MachinegunProcessor:
    """A processor behind a URL speaking Machinegun's ``Processor`` service."""

    def __init__(self, url: str, client: HttpTransport) -> None:
        self.url = url
        self.client = client

    async def process(self, kind: str, args: JsonData, machine: ProcessorView, timeout_ms: int, now_ms: int, *, step: Step | None = None) -> Answer:
        rng = step.history if step is not None else HistoryRange()
        view: codec.MachineShown = {**machine, "timer": format_time(step.timer_at) if step is not None else None}
        request = request_of(kind, args, codec.machine_struct(view, rng))
        try:
            trace, headers = caller_context(step)
            result = await woody.call(self.client, self.url, ProcessorService, *request, trace=trace, timeout_ms=timeout_ms, now_ms=now_ms, headers=headers)
        except stateproc.RepairFailed as refused:
            raise ProcessorError("the processor refused the repair (RepairFailed)", permanent=True, refusal=codec.value_to_json(refused.reason)) from refused
        except woody.WoodyError as exc:
            raise failure_of(exc) from exc
        except ProcessorError:  # not reached, or no answer in time (the transport's own)
            raise
        except Exception as exc:
            # A body that does not decode as the method's reply (thriftpy2 raises TException, struct.error,
            # UnicodeDecodeError… by where it broke): the processor's bug, like a malformed JSON answer.
            raise ProcessorError(f"the processor's answer is not a Thrift {request[0]} reply: {type(exc).__name__}: {exc}", permanent=True) from exc
        return answer_of(result, now_ms)


def caller_context(step: Step | None) -> tuple[woody.Trace, dict[str, str]]:
    """The processor call's span and the headers it carries: a child span of the woody client's call that
    caused the step, with its ``woody.meta.*``, as Machinegun passes them on; a new trace for a step nobody
    called (a timer, a notification, the JSON API)."""
    headers = dict(step.origin.headers) if step is not None and step.origin is not None else {}
    trace_id, span_id = headers.get(woody.TRACE_ID), headers.get(woody.SPAN_ID)
    if not trace_id or not span_id:
        return woody.root_trace(), {}
    meta = {k: v for k, v in headers.items() if k.startswith(woody.META_PREFIX)}
    return woody.Trace(trace_id, woody.new_id(), span_id), meta


def request_of(kind: str, args: JsonData, machine: object) -> tuple[str, dict[str, object]]:
    """(method, its arguments) of the Processor service for a step of ``kind``."""
    if kind == "call":
        return "ProcessCall", {"a": stateproc.CallArgs(arg=codec.value_from_json(args), machine=machine)}
    if kind == "repair":
        return "ProcessRepair", {"a": stateproc.RepairArgs(arg=codec.value_from_json(args), machine=machine)}
    if kind == "init":
        signal = stateproc.Signal(init=stateproc.InitSignal(arg=codec.value_from_json(args)))
    elif kind == "timeout":
        signal = stateproc.Signal(timeout=stateproc.TimeoutSignal())
    else:
        signal = stateproc.Signal(notification=stateproc.NotificationSignal(arg=codec.value_from_json(args)))
    return "ProcessSignal", {"a": stateproc.SignalArgs(signal=signal, machine=machine)}


def failure_of(exc: woody.WoodyError) -> ProcessorError:
    """A woody system error from the processor, by its class: retry what may heal, fail what will not."""
    detail = f"the processor answered {exc.status} {exc.error_class}: {exc.reason}"
    error_class = exc.error_class.lower()
    if exc.status == 504 or error_class == woody.RESULT_UNKNOWN.lower():
        return ProcessorError(detail, timeout=True)
    if exc.status in TRANSIENT and error_class != woody.RESULT_UNEXPECTED.lower():
        return ProcessorError(detail)
    return ProcessorError(detail, permanent=True)


def answer_of(result: Any, now_ms: int) -> Answer:
    """A SignalResult / CallResult / RepairResult as the face's Answer."""
    change, action = result.change, result.action
    if change is None or action is None:
        raise ProcessorError("the processor's result has no change or no action", permanent=True)
    try:
        answer = Answer(
            events=[codec.content_to_json(e) for e in change.events or []],
            aux_state=UNSET if change.aux_state is None else codec.content_to_json(change.aux_state),
            response=codec.value_to_json(getattr(result, "response", None)),
            remove=action.remove is not None,
        )
        if action.timer is not None:
            if action.timer.unset_timer is not None:
                answer.timer_at = None
            elif action.timer.set_timer is not None:
                answer.timer_at, answer.timer_range, answer.timer_timeout_ms = _timer(action.timer.set_timer, now_ms)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ProcessorError(f"the processor's result is invalid: {exc}", permanent=True) from exc
    return answer


def _timer(set_timer: Any, now_ms: int) -> tuple[int, HistoryRange | None, int | None]:
    """(due epoch ms, the timeout step's range, its timeout) of a SetTimerAction."""
    timer = set_timer.timer
    if timer is None:
        raise ValueError("SetTimerAction.timer is required")
    if timer.timeout is not None:
        if timer.timeout < 0:
            raise ValueError("a timer's timeout is negative")
        due = now_ms + timer.timeout * 1000  # base.Timeout is in seconds
    elif timer.deadline is not None:
        due = parse_time(timer.deadline)
    else:
        raise ValueError("base.Timer has neither timeout nor deadline")
    rng = None if set_timer.range is None else codec.history_range(set_timer.range)
    timeout_ms = None if set_timer.timeout is None else max(1, set_timer.timeout) * 1000
    return due, rng, timeout_ms


__all__ = ["MachinegunProcessor", "answer_of", "request_of"]
