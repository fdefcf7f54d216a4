"""The history of a chaos run: every operation a client issued and what it learnt, as JSON lines.

An operation ends ``ok`` (the server said it happened), ``fail`` (the server said it did not) or ``unknown``
(no answer: a dropped connection, a timeout, a 5xx from a dying server). The checker may only demand of the
final state what the ``ok`` operations promise, and may only forbid what no operation could have caused.
Nemesis faults go into the same file (face ``nemesis``), so a violation can be read next to what preceded it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from mainspring.client.errors import ServiceUnavailable

OK, FAIL, UNKNOWN = "ok", "fail", "unknown"

# Answers a server gives while it is going down or cut off from the store: whether the operation happened
# is not known from them.
UNKNOWN_STATUSES = frozenset({500, 502, 503, 504})


@dataclass
class Op:
    face: str
    kind: str
    key: str
    outcome: str = UNKNOWN
    value: dict[str, Any] = field(default_factory=dict)
    actor: str = ""
    start: float = 0.0
    end: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), default=str)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status a client error carries (every face client names it ``status``)."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def outcome_of(exc: BaseException) -> str:
    """``fail`` when the server definitely refused, ``unknown`` when the operation may have happened."""
    if isinstance(exc, ServiceUnavailable) and exc.__cause__ is not None:
        exc = exc.__cause__  # the clients wrap transport failures; what failed decides
    if isinstance(exc, httpx.ConnectError):
        return FAIL  # no connection, so the request was never sent (clients here do not retry inside a call)
    if isinstance(exc, httpx.TransportError | TimeoutError | OSError):
        return UNKNOWN
    status = status_of(exc)
    if status is None or status in UNKNOWN_STATUSES:
        return UNKNOWN
    return FAIL


class History:
    """Append-only JSON-lines history, safe to write from several threads and tasks."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.ops: list[Op] = []
        self._lock = threading.Lock()
        self._file = path.open("a", encoding="utf-8") if path else None

    def add(self, op: Op) -> Op:
        if not op.end:
            op.end = time.time()
        with self._lock:
            self.ops.append(op)
            if self._file:
                self._file.write(op.to_json() + "\n")
                self._file.flush()
        return op

    def record(self, face: str, kind: str, key: str, outcome: str, actor: str = "", **value: Any) -> Op:
        now = time.time()
        return self.add(Op(face, kind, key, outcome, value, actor, now, now))

    @contextmanager
    def op(self, face: str, kind: str, key: str, actor: str = "", **value: Any) -> Iterator[Op]:
        """Record one operation: ``ok`` when the block ends normally, else ``fail``/``unknown`` by the error,
        which is re-raised. The block may put what it learnt into ``op.value`` or set ``op.outcome``."""
        op = Op(face, kind, key, OK, dict(value), actor, time.time())
        try:
            yield op
        except BaseException as exc:
            op.outcome = outcome_of(exc)
            op.value["error"] = f"{type(exc).__name__}: {exc}"[:300]
            status = status_of(exc)
            if status is not None:
                op.value["status"] = status
            code = getattr(exc, "code", None)
            if code:
                op.value["code"] = code
            self.add(op)
            raise
        self.add(op)

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None

    @staticmethod
    def load(path: Path) -> list[Op]:
        ops = []
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    ops.append(Op(**json.loads(line)))
        return ops


def summarize(ops: list[Op]) -> dict[str, dict[str, int]]:
    """Counts by ``face.kind`` and outcome (what the report prints)."""
    counts: dict[str, dict[str, int]] = {}
    for op in ops:
        row = counts.setdefault(f"{op.face}.{op.kind}", {OK: 0, FAIL: 0, UNKNOWN: 0})
        row[op.outcome] = row.get(op.outcome, 0) + 1
    return dict(sorted(counts.items()))


def verdicts(ops: list[Op]) -> dict[str, dict[str, int]]:
    """Counts by ``face.kind`` of each key's final word over all its attempts: ok if any attempt was, else
    unknown if any was, else fail (what the checker could hold the servers to)."""
    seen: dict[tuple[str, str], set[str]] = {}
    for op in ops:
        seen.setdefault((f"{op.face}.{op.kind}", op.key), set()).add(op.outcome)
    counts: dict[str, dict[str, int]] = {}
    for (kind, _key), outcomes in seen.items():
        word = OK if OK in outcomes else UNKNOWN if UNKNOWN in outcomes else FAIL
        row = counts.setdefault(kind, {OK: 0, FAIL: 0, UNKNOWN: 0})
        row[word] += 1
    return dict(sorted(counts.items()))
