"""The project's Machinegun IDL, loaded once with thriftpy2 (types and services generated at import)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import thriftpy2
from thriftpy2.utils import deserialize, serialize

HERE = Path(__file__).parent


def _load(name: str) -> ModuleType:
    # module_name must end in "_thrift" for thriftpy2; include_dirs resolves the `include "base.thrift"` lines.
    return thriftpy2.load(str(HERE / f"{name}.thrift"), module_name=f"mainspring_mg_{name}_thrift", include_dirs=[str(HERE)])


base = _load("base")
msgpack = _load("msgpack")
stateproc = _load("state_processing")
evsink = _load("event_sink")

Value = msgpack.Value
Automaton = stateproc.Automaton
Processor = stateproc.Processor
EventSink = stateproc.EventSink

__all__ = ["Automaton", "EventSink", "Processor", "Value", "base", "deserialize", "evsink", "msgpack", "serialize", "stateproc"]
