"""Machinegun's msgpack ``Value`` and ``Content`` <-> the JSON the machines face stores, losslessly.

The store keeps args, events, aux state and responses as JSON, and JSON processors (HTTP or in-process)
read them as JSON, so a Value is kept as the JSON it naturally is, and tagged only where JSON cannot say it:

| Value | JSON |
| --- | --- |
| ``nl`` / ``b`` / ``i`` / ``flt`` / ``str`` | ``null`` / ``true``,``false`` / integer / float (always with a fraction or exponent) / string |
| ``arr`` | array |
| ``obj`` with string keys, none starting with ``$`` | object |
| any other ``obj`` | ``{"$map": [[key, value], ...]}`` (keys kept in order, of any type) |
| ``bin`` | ``{"$bin": "<base64>"}`` |
| ``str`` that is not UTF-8 (hellgate marshals any binary as ``str``) or holds NUL | ``{"$str": "<base64>"}`` |
| ``flt`` that JSONB would not give back as written: ``-0.0``, ±1e16 and past, ±inf, NaN | ``{"$flt": "<repr>"}`` |

PostgreSQL keeps JSON as ``jsonb``: numbers as ``numeric`` (``1e16`` comes back as the integer
``10000000000000000``, ``-0.0`` as ``0.0``), no NUL in strings, object keys in its own order. So the two tags
above keep every Value exact on both engines; a map's order is not kept (a msgpack map has none, and
Erlang's maps have none either).

A ``Content`` with a ``format_version`` is ``{"$fv": n, "$data": <value>}``; without one it is just its
value. Because a plain object never has a ``$`` key (those are written as ``$map``), every object whose
keys start with ``$`` is a tag and decoding is exact: ``value_from_json(value_to_json(v)) == v`` for every
Value, and a float stays a float because Python's ``json`` writes ``1.0``, not ``1``.
"""

from __future__ import annotations

import base64
import builtins
import math
from typing import NotRequired, Protocol, TypedDict, cast

from typing_extensions import ReadOnly

from mainspring.core.errors import InvalidRequest
from mainspring.machines.machinegun.idl import msgpack, stateproc
from mainspring.machines.processor import HistoryEvent
from mainspring.machines.settings import HistoryRange
from mainspring.types import JsonData, JsonObject

Value = msgpack.Value
Content = stateproc.Content

BIN, MAP, VERSION, DATA, STR, FLT = "$bin", "$map", "$fv", "$data", "$str", "$flt"
EXACT_FLOAT = 1e16
"""From here on a float is written in JSON without a fraction (``1e+16``), which jsonb reads as an integer."""
I64 = (-(2**63), 2**63 - 1)


class MsgpackValue(Protocol):
    """Machinegun's msgpack ``Value`` as thriftpy2 makes it: a union, exactly one field set."""

    nl: object | None
    b: bool | None
    i: int | None
    flt: float | None
    str: builtins.str | bytes | None
    bin: bytes | None
    arr: list[MsgpackValue] | None
    obj: dict[MsgpackValue, MsgpackValue] | None


class ThriftContent(Protocol):
    """``mg_proto_base.Content``: a value and its format version."""

    format_version: int | None
    data: MsgpackValue


class ThriftHistoryRange(Protocol):
    """``mg_proto_base.HistoryRange``."""

    after: int | None
    limit: int | None
    direction: object


class ThriftMachineRef(Protocol):
    """``mg_proto_state_processing.MachineRef``."""

    id: builtins.str | bytes | None
    tag: builtins.str | bytes | None


class ThriftMachineDescriptor(Protocol):
    """``mg_proto_state_processing.MachineDescriptor``."""

    ns: builtins.str | bytes
    ref: ThriftMachineRef | None
    range: ThriftHistoryRange | None


class NotAValue(InvalidRequest):
    """JSON that has no msgpack Value (an integer past i64, a NaN); the processor's answer is refused."""

    code, title = "not_a_msgpack_value", "The value cannot be written as a Machinegun msgpack Value"


def value_to_json(value: MsgpackValue | None) -> JsonData:
    """A msgpack Value (thriftpy2 union: exactly one field set) as JSON, to be stored as a whole (args, an
    event, aux state, a response)."""
    if value is None or value.nl is not None:
        return None
    if value.b is not None:
        return value.b
    if value.i is not None:
        return value.i
    if value.flt is not None:
        number = float(value.flt)
        if abs(number) < EXACT_FLOAT and not (number == 0 and math.copysign(1.0, number) < 0):
            return number
        return {FLT: repr(number)}  # -0.0, big, infinite or NaN: jsonb would not give it back
    if value.str is not None:
        text = value.str
        if isinstance(text, str) and "\x00" not in text:
            return text
        # thriftpy2 hands over a str that is not UTF-8 as bytes; jsonb stores no NUL.
        raw = text if isinstance(text, bytes) else text.encode("utf-8")
        return {STR: base64.b64encode(raw).decode("ascii")}
    if value.bin is not None:
        return {BIN: base64.b64encode(value.bin).decode("ascii")}
    if value.arr is not None:
        return [value_to_json(v) for v in value.arr]
    if value.obj is not None:
        pairs = [(value_to_json(k), value_to_json(v)) for k, v in value.obj.items()]
        if all(isinstance(k, str) and not k.startswith("$") for k, _ in pairs):
            return cast(JsonObject, dict(pairs))  # every key a str: checked above
        entries: list[JsonData] = [[k, v] for k, v in pairs]
        return {MAP: entries}
    return None  # a union with no field set: Machinegun reads it as nil too


def value_from_json(data: object) -> MsgpackValue:
    """JSON as a msgpack Value; the inverse of ``value_to_json``."""
    if data is None:
        return Value(nl=msgpack.Nil())
    if isinstance(data, bool):  # before int: bool is an int in Python
        return Value(b=data)
    if isinstance(data, int):
        if not I64[0] <= data <= I64[1]:
            raise NotAValue(f"integer {data} does not fit a msgpack i64")
        return Value(i=data)
    if isinstance(data, float):
        if not math.isfinite(data):
            raise NotAValue("msgpack Values have no NaN or infinity")
        return Value(flt=data)
    if isinstance(data, str):
        return Value(str=data)
    if isinstance(data, (bytes, bytearray)):
        return Value(bin=bytes(data))
    if isinstance(data, list | tuple):
        return Value(arr=[value_from_json(v) for v in data])
    if isinstance(data, dict):
        if set(data) == {BIN} and isinstance(data[BIN], str):
            return Value(bin=base64.b64decode(data[BIN]))
        if set(data) == {STR} and isinstance(data[STR], str):
            raw = base64.b64decode(data[STR])
            try:
                return Value(str=raw.decode("utf-8"))  # as thriftpy2 decodes it: text when it is UTF-8
            except UnicodeDecodeError:
                return Value(str=raw)
        if set(data) == {FLT} and isinstance(data[FLT], str):
            try:
                return Value(flt=float(data[FLT]))
            except ValueError as exc:
                raise NotAValue(f"{FLT} {data[FLT]!r} is not a float") from exc
        if set(data) == {MAP} and isinstance(data[MAP], list):
            return Value(obj={value_from_json(k): value_from_json(v) for k, v in data[MAP]})
        return Value(obj={value_from_json(str(k)): value_from_json(v) for k, v in data.items()})
    raise NotAValue(f"a {type(data).__name__} has no msgpack Value")


def content_to_json(content: ThriftContent | None) -> JsonData:
    """A Content (an event body or aux state) as JSON: its value, tagged with its format version if any."""
    if content is None:
        return None
    data = value_to_json(content.data)
    if content.format_version is None:
        return data
    return {VERSION: content.format_version, DATA: data}


def content_from_json(data: JsonData) -> ThriftContent:
    """JSON as a Content; the inverse of ``content_to_json``."""
    version, value = split_content(data)
    return Content(format_version=version, data=value_from_json(value))


def split_content(data: JsonData) -> tuple[int | None, JsonData]:
    """(format version or None, the value's JSON) of stored content JSON."""
    if isinstance(data, dict) and set(data) == {VERSION, DATA} and isinstance(data[VERSION], int):
        return cast(int, data[VERSION]), data[DATA]  # an int: checked above
    return None, data


class BadHistoryRange(InvalidRequest):
    code, title = "invalid_history_range", "The HistoryRange has a negative limit or an unknown direction"


def history_range(rng: ThriftHistoryRange | None) -> HistoryRange:
    """A Thrift HistoryRange as the face's (absent: the whole history, oldest first)."""
    if rng is None:
        return HistoryRange()
    if rng.limit is not None and rng.limit < 0:
        raise BadHistoryRange("HistoryRange.limit is negative")
    direction = {None: "forward", stateproc.Direction.forward: "forward", stateproc.Direction.backward: "backward"}.get(rng.direction)
    if direction is None:
        raise BadHistoryRange(f"HistoryRange.direction {rng.direction!r} is unknown")
    return HistoryRange(after=rng.after, limit=rng.limit, direction=direction)


def thrift_range(rng: HistoryRange) -> ThriftHistoryRange:
    direction = stateproc.Direction.backward if rng.direction == "backward" else stateproc.Direction.forward
    return stateproc.HistoryRange(after=rng.after, limit=rng.limit, direction=direction)


class MachineShown(TypedDict):
    """What ``machine_struct`` reads: Get's answer, or a processor's view with its ``timer``."""

    namespace: str
    id: str
    status: str
    history: list[HistoryEvent]
    aux_state: JsonData
    timer: str | None
    error: NotRequired[ReadOnly[JsonObject | None]]
    """Get's answer has it; a processor's view does not."""


def machine_struct(machine: MachineShown, rng: HistoryRange) -> object:
    """A machine as the face shows it (Get's answer, or a processor's view plus ``timer``) as Machinegun's
    ``Machine``: what GetMachine answers and what a Machinegun processor is sent."""
    history = []
    for event in machine["history"]:
        version, data = split_content(event["data"])
        history.append(stateproc.Event(id=event["id"], created_at=event["created_at"], format_version=version, data=value_from_json(data)))
    if machine["status"] == "failed":
        error = machine.get("error") or {}
        status = stateproc.MachineStatus(failed=stateproc.MachineStatusFailed(reason=str(error.get("detail", "failed"))))
    else:
        status = stateproc.MachineStatus(working=stateproc.MachineStatusWorking())
    return stateproc.Machine(
        ns=machine["namespace"], id=machine["id"], history=history, history_range=thrift_range(rng), status=status,
        aux_state=content_from_json(machine.get("aux_state")), timer=machine.get("timer"),
    )
