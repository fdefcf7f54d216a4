"""woody's HTTP conventions for Thrift calls, as woody_erlang's server and client use them.

A call is ``POST`` with ``content-type: application/x-thrift`` and a Thrift-binary message as the body, and
the trace headers ``woody.trace-id``, ``woody.span-id``, ``woody.parent-id`` (a server refuses a call
without them, ``400``), optionally ``woody.deadline`` (RFC 3339 UTC with milliseconds) and ``woody.meta.*``.

The answer's status and ``woody.error-class`` tell a woody client what happened:

| status | ``woody.error-class`` | the client raises |
| --- | --- | --- |
| 200 | — | the result |
| 200 | ``Business Error`` (``woody.error-reason``: the exception's name) | the IDL's declared exception, from the body |
| 400, 405, 415, 406 | ``Result Unexpected`` | a system error: the request was bad |
| 500 | ``Result Unexpected`` | a system error: the server failed; the outcome is unexpected |
| 503 | ``Resource Unavailable`` | a system error: nothing was done, safe to retry |
| 504 | ``Result Unknown`` | a system error: it may or may not have happened |
| 502 | any of the three | the same classes, caused by a service further on (for Mainspring: the processor) |

woody_erlang also writes the legacy ``x-rbk-error-class`` / ``x-rbk-error-reason`` pair, so Mainspring does
too. (There is no ``woody.error-type`` header in woody; the class is the type.)
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thriftpy2.protocol.binary import TBinaryProtocol
from thriftpy2.thrift import TClient

# The pure-Python buffer and protocol to read: the Cython ones spin on, or silently half-read, a truncated
# message, and these bytes come from the network.
from thriftpy2.transport.memory import TMemoryBuffer

try:  # To write, the Cython ones when built (the same bytes, ~20× less CPU): what they write is ours.
    from thriftpy2.protocol.cybin import TCyBinaryProtocol as WriteProtocol  # type: ignore[attr-defined]  # compiled, no stub
    from thriftpy2.transport.memory import TCyMemoryBuffer as WriteBuffer
except ImportError:  # pragma: no cover - a platform without thriftpy2's extensions
    WriteProtocol, WriteBuffer = TBinaryProtocol, TMemoryBuffer

from mainspring.machines.processor import HttpTransport
from mainspring.store import format_time, parse_time

CONTENT_TYPE = "application/x-thrift"
TRACE_ID, SPAN_ID, PARENT_ID, DEADLINE = "woody.trace-id", "woody.span-id", "woody.parent-id", "woody.deadline"
ERROR_CLASS, ERROR_REASON = "woody.error-class", "woody.error-reason"
META_PREFIX = "woody.meta."
"""Context a woody client passes along (``woody.meta.user-identity.id`` and the like); carried to the processor."""
LEGACY_ERROR_CLASS, LEGACY_ERROR_REASON = "x-rbk-error-class", "x-rbk-error-reason"
ROOT_PARENT = "undefined"
"""woody's parent id of a root span (a call nobody made on behalf of another)."""

BUSINESS = "Business Error"
RESULT_UNEXPECTED = "Result Unexpected"
RESOURCE_UNAVAILABLE = "Resource Unavailable"
RESULT_UNKNOWN = "Result Unknown"


@dataclass(frozen=True)
class Trace:
    """The span of one call: who started the trace, this call's span, and the span that made it."""

    trace_id: str
    span_id: str
    parent_id: str

    def child(self) -> Trace:
        """The span of a call this one makes (Mainspring calling a processor on behalf of a client)."""
        return Trace(self.trace_id, new_id(), self.span_id)

    def headers(self) -> dict[str, str]:
        return {TRACE_ID: self.trace_id, SPAN_ID: self.span_id, PARENT_ID: self.parent_id}


def new_id() -> str:
    return secrets.token_hex(10)


def root_trace() -> Trace:
    """A new trace, for calls Mainspring starts itself (timers, notifications)."""
    span = new_id()
    return Trace(span, span, ROOT_PARENT)


def error_headers(error_class: str, reason: str) -> dict[str, str]:
    # Header values are latin-1 on the wire; a reason is for people, so anything else is replaced.
    safe = reason.encode("latin-1", "replace").decode("latin-1").replace("\r", " ").replace("\n", " ")[:1000]
    return {ERROR_CLASS: error_class, ERROR_REASON: safe, LEGACY_ERROR_CLASS: error_class, LEGACY_ERROR_REASON: safe}


def format_deadline(ms: int) -> str:
    """A deadline as woody writes it: RFC 3339 UTC with milliseconds."""
    return format_time(ms)  # type: ignore[return-value]


def parse_deadline(value: str) -> int:
    """Epoch ms of a ``woody.deadline`` value; ValueError if it is not RFC 3339."""
    return parse_time(value)


@dataclass
class WoodyError(Exception):
    """A woody system error answered by the server called: its status and ``woody.error-class``."""

    status: int
    error_class: str
    reason: str

    def __str__(self) -> str:
        return f"{self.status} {self.error_class}: {self.reason}"


def encode_call(service: Any, api: str, args: Mapping[str, object], seqid: int = 0) -> bytes:
    """A Thrift-binary CALL message of ``service.api`` (thriftpy2's client writes it)."""
    out = WriteBuffer()
    client = TClient(service, WriteProtocol(out))
    client._seqid = seqid
    client._send(api, **args)
    return out.getvalue()  # type: ignore[no-any-return]


def decode_reply(service: Any, api: str, body: bytes) -> Any:
    """The result of a REPLY message, or its declared exception raised (thriftpy2's client reads it)."""
    return TClient(service, TBinaryProtocol(TMemoryBuffer(body)))._recv(api)


async def call(
    client: HttpTransport, url: str, service: Any, api: str, args: Mapping[str, object], *, trace: Trace, timeout_ms: int,
    now_ms: int, headers: dict[str, str] | None = None,
) -> Any:
    """Call ``service.api`` at ``url`` as a woody client: the result, a declared exception raised, or
    ``WoodyError`` for a system error; transport failures are the transport's ``ProcessorError``."""
    request_headers = {
        "content-type": CONTENT_TYPE, "accept": CONTENT_TYPE, **trace.headers(),
        DEADLINE: format_deadline(now_ms + timeout_ms), **(headers or {}),
    }
    reply = await client.post(url, encode_call(service, api, args), request_headers, timeout_ms)
    if reply.status_code != 200:
        error_class = reply.headers.get(ERROR_CLASS, RESULT_UNEXPECTED)
        raise WoodyError(reply.status_code, error_class, reply.headers.get(ERROR_REASON, reply.text[:300]))
    return decode_reply(service, api, reply.content)
