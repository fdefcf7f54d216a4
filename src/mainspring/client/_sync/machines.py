# Generated from client/_async by scripts/sync_clients.py: edit that file, not this one.
"""The machines client (API.md §2): namespaces and the Automaton calls."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, cast
from urllib.parse import quote

from mainspring.client._sync.base import BaseClient, body
from mainspring.client.models import Machine, MachineOperation, MachinePage, Namespace, Notified, StepAnswer
from mainspring.types import JsonData, JsonInput, JsonObject


def _machines(ns: str, machine_id: str | None = None) -> str:
    path = f"/v1/namespaces/{quote(ns, safe='')}/machines"
    return path if machine_id is None else f"{path}/{quote(machine_id, safe='')}"


def _key(idempotency_key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": idempotency_key} if idempotency_key else {}


class MachinesClient(BaseClient):
    """Every call of the machines face. Start, Call, Notify and Repair take ``idempotency_key``: with one,
    a repeat answers the first answer and changes nothing, so the call is retried safely."""

    def put_namespace(self, ns: str, *, url: str | None = None, timeout_ms: int = 30_000,
                            retry: JsonObject | None = None, history: JsonObject | None = None) -> Namespace:
        """Store namespace ``ns``: its processor (``url``; None: the in-process one registered under its
        name), the processor's ``timeout_ms``, its ``retry`` policy and ``history`` settings."""
        fields = body(processor={"url": url, "timeout_ms": timeout_ms}, retry=retry, history=history)
        return cast(Namespace, self._json("PUT", f"/v1/namespaces/{quote(ns, safe='')}", idempotent=True, json=fields))

    def get_namespace(self, ns: str) -> Namespace:
        """The stored settings of namespace ``ns``."""
        return cast(Namespace, self._json("GET", f"/v1/namespaces/{quote(ns, safe='')}", idempotent=True))

    def start(self, ns: str, machine_id: str, args: JsonInput = None, *, idempotency_key: str | None = None) -> Machine:
        """Start machine ``machine_id`` (the processor's ``init``); ``Conflict`` when it exists,
        ``ProcessorRefused`` when the processor refuses for good (nothing is created)."""
        answer = self._json("POST", _machines(ns), idempotent=idempotency_key is not None,
                                  json={"id": machine_id, "args": args}, headers=_key(idempotency_key))
        return cast(Machine, answer)

    def call(self, ns: str, machine_id: str, args: JsonInput = None, *, idempotency_key: str | None = None,
                   timeout_ms: int | None = None) -> JsonData:
        """Call a machine (the processor's ``call``) and answer the processor's ``response``;
        ``ProcessorRefused`` when the processor refuses for good (the machine is now failed)."""
        answer = self._json("POST", f"{_machines(ns, machine_id)}/call", idempotent=idempotency_key is not None,
                                  json={"args": args, **body(timeout_ms=timeout_ms)}, headers=_key(idempotency_key))
        return cast(StepAnswer, answer)["response"]

    def notify(self, ns: str, machine_id: str, args: JsonInput = None, *, idempotency_key: str | None = None) -> str:
        """Queue a notification for a machine (delivered later, in order, at least once); answers its id."""
        answer = self._json("POST", f"{_machines(ns, machine_id)}/notifications", idempotent=idempotency_key is not None,
                                  json={"args": args}, headers=_key(idempotency_key))
        return str(cast(Notified, answer)["id"])

    def repair(self, ns: str, machine_id: str, args: JsonInput = None, *, simple: bool = False,
                     idempotency_key: str | None = None) -> JsonData:
        """Repair a failed machine through the processor's ``repair`` (or, ``simple``, without calling
        it); answers the processor's ``response``. ``ProcessorRefused``: the processor refused, it stays failed."""
        answer = self._json("POST", f"{_machines(ns, machine_id)}/repair", idempotent=idempotency_key is not None,
                                  json={"args": args, "simple": simple}, headers=_key(idempotency_key))
        return cast(StepAnswer, answer)["response"]

    def get(self, ns: str, machine_id: str, *, after: int | None = None, limit: int | None = None,
                  direction: Literal["forward", "backward"] = "forward") -> Machine:
        """A machine with a range of its history (``after`` an event id, ``limit`` events, ``direction``)."""
        params = {"after": after, "limit": limit, "direction": direction}
        return cast(Machine, self._json("GET", _machines(ns, machine_id), idempotent=True, params=params))

    def remove(self, ns: str, machine_id: str) -> None:
        """Remove a machine and its history."""
        self._json("DELETE", _machines(ns, machine_id), idempotent=True)

    def operation(self, ns: str, machine_id: str, key: str) -> MachineOperation:
        """Whether and how the operation with Idempotency-Key ``key`` ended."""
        path = f"{_machines(ns, machine_id)}/operations/{quote(key, safe='')}"
        return cast(MachineOperation, self._json("GET", path, idempotent=True))

    def page(self, ns: str, *, status: Literal["working", "failed"] | None = None, limit: int = 100,
                   cursor: str | None = None) -> MachinePage:
        """One page of the namespace's machines."""
        params = {"status": status, "limit": limit, "cursor": cursor}
        return cast(MachinePage, self._json("GET", _machines(ns), idempotent=True, params=params))

    def list(self, ns: str, *, status: Literal["working", "failed"] | None = None,
                   limit: int = 100) -> Iterator[Machine]:
        """Every machine of the namespace (of ``status``), ``limit`` a page."""
        cursor: str | None = None
        while True:
            page = self.page(ns, status=status, limit=limit, cursor=cursor)
            for machine in page["machines"]:
                yield machine
            cursor = page.get("next_cursor")
            if not cursor:
                return
