"""Where a worker's queue handlers get their items, and where their outcomes go: the store itself
(``StoreQueues``: a worker beside the server, or inside it) or a server's HTTP API (``HttpQueues``: a worker
that needs no database credentials, as Temporal's and Hatchet's do).

Both lease, heartbeat and release with the same fencing: a release or heartbeat with a lost lease changes
nothing (``409 lease_lost`` over HTTP). What differs is how a worker learns of work: the store wakes it
(NOTIFY, or the in-process signal), the HTTP API long-polls (``wait_ms``); and how it learns that an item it
runs was cancelled: the store signals at once, over HTTP the next heartbeat is refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, cast

from pydantic import BaseModel

from mainspring.client._async.base import body as without_unset
from mainspring.client._async.interactions import AsyncInteractionsClient
from mainspring.client._async.interactions import _queue as queue_path
from mainspring.client.errors import InvalidRequest, LeaseLost, ServiceUnavailable
from mainspring.core.runtime import log_failure
from mainspring.interactions import data, leasing, outcomes, service
from mainspring.interactions.leasing import Leased
from mainspring.interactions.models import Interaction, InteractionList, Lease, QueueSettingsIn
from mainspring.interactions.settings import InteractionsSettings
from mainspring.store import Store, format_time
from mainspring.store.notify import Waiter

log = logging.getLogger("mainspring.interactions.worker")

Release = tuple[int, str, outcomes.Outcome]
ModelT = TypeVar("ModelT", bound=BaseModel)


class Wakeup(Protocol):
    async def wait(self, timeout_s: float) -> bool: ...


class QueueSource(Protocol):
    """What a worker's queue runner needs from where its items live."""

    long_polls: bool
    """``lease`` itself waits for work (so the runner does not wait again after an empty lease)."""

    def waiter(self, channel: str) -> Wakeup:
        """A wake-up for ``channel``, taken before the call whose result it may change."""

    def until_next(self, next_due: int | None) -> float:
        """Seconds until ``next_due`` (epoch ms of the source's clock)."""

    async def lease(self, queue: str, worker: str, max_items: int, lease_ms: int | None) -> Leased: ...

    def interaction(self, item: dict[str, object]) -> Interaction:
        """A leased item (one of ``Leased.items``) as its handler receives it."""

    async def release_many(self, queue: str, releases: Sequence[Release]) -> list[bool]:
        """Store each outcome; per release, whether its lease was still held (a lost one changed nothing)."""

    def releases_with_lease(self, queue: str) -> bool:
        """Whether ``release_and_lease`` stores outcomes and leases in one round trip now: the runner then sends
        the outcomes waiting with its next lease instead of on their own."""

    async def release_and_lease(
        self, queue: str, worker: str, releases: Sequence[Release], max_items: int, lease_ms: int | None
    ) -> tuple[list[bool], Leased]:
        """``release_many`` then ``lease``, in one call where the source can."""

    async def heartbeat_many(self, leases: Sequence[tuple[int, str]], lease_ms: int) -> set[int]:
        """Extend the leases; the ids still held."""

    async def still_held(self, leases: dict[int, str]) -> set[int]:
        """Of ``leases``, those still held (asked when a wake-up says items of the queue finished)."""

    async def create(self, queue: str, fields: dict[str, Any]) -> dict[str, Any]: ...

    async def children(self, item_id: str, name: str | None) -> list[dict[str, Any]]: ...

    async def apply_queue_settings(self, settings: dict[str, dict[str, Any]]) -> dict[str, service.Changes]:
        """Store the settings of ``settings`` (per queue, as the API gives them) over each queue's; answers what changed."""


_INTERACTION_FIELDS = frozenset(Interaction.model_fields)
_LEASE_FIELDS = frozenset(Lease.model_fields)
_EVERY_FIELD = {Interaction: set(_INTERACTION_FIELDS), Lease: set(_LEASE_FIELDS)}
"""What ``model_fields_set`` answers for a model built with every field given: one set per class, shared (pydantic
adds a field's name to it when the field is assigned: with every field in it already, nothing changes)."""


_SLOTS = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")
_SETTERS = [BaseModel.__dict__[name].__set__ for name in _SLOTS] if all(name in BaseModel.__dict__ for name in _SLOTS) else None
"""The instance attributes pydantic documents, set through their slots (a third faster than ``object.__setattr__``
on each); None with a pydantic that keeps them otherwise: then every item is validated."""


def _built(cls: type[ModelT], values: dict[str, object]) -> ModelT:
    """A model of ``values`` (every field, each with its type), as ``model_construct`` makes it (the instance
    attributes pydantic documents) without its per-field Python loop: a fifth of the time of ``model_validate``,
    a tenth of ``model_construct``'s for an ``Interaction``. ``values`` becomes the model's own."""
    assert _SETTERS is not None
    built = object.__new__(cls)
    set_dict, set_fields, set_extra, set_private = _SETTERS
    set_dict(built, values)
    set_fields(built, _EVERY_FIELD[cls])
    set_extra(built, None)
    set_private(built, None)
    return built


def stored_interaction(item: dict[str, object]) -> Interaction:
    """A leased item as the store answers it (``service.to_api`` of its own row: every field present, with its
    type) as an ``Interaction``, built without validating again; ``item`` becomes its fields. Anything else (a
    field more or less, an ``error_detail``, which a worker over HTTP may have sent) is validated."""
    lease = item.get("lease")
    if _SETTERS is None or item.keys() != _INTERACTION_FIELDS or item["error_detail"] is not None or not isinstance(lease, dict) or lease.keys() != _LEASE_FIELDS:
        return Interaction.model_validate(item)
    item["lease"] = _built(Lease, lease)
    return _built(Interaction, item)


class StoreQueues:
    """The store itself: leases and releases in its transactions, woken by its notifier."""

    long_polls = False

    def __init__(self, store: Store, cfg: InteractionsSettings) -> None:
        self.store = store
        self.cfg = cfg

    def waiter(self, channel: str) -> Waiter:
        return self.store.notifier.waiter(channel)

    def until_next(self, next_due: int | None) -> float:
        return leasing.until_next(self.store, next_due)

    async def lease(self, queue: str, worker: str, max_items: int, lease_ms: int | None) -> Leased:
        return await leasing.lease(self.store, self.cfg, queue, worker, max_items, lease_ms)

    def interaction(self, item: dict[str, object]) -> Interaction:
        return stored_interaction(item)

    async def release_many(self, queue: str, releases: Sequence[Release]) -> list[bool]:
        return await leasing.release_many(self.store, queue, releases)

    def releases_with_lease(self, queue: str) -> bool:
        return leasing.releases_with_lease(self.store, queue)

    async def release_and_lease(
        self, queue: str, worker: str, releases: Sequence[Release], max_items: int, lease_ms: int | None
    ) -> tuple[list[bool], Leased]:
        return await leasing.release_and_lease(self.store, self.cfg, queue, worker, releases, max_items, lease_ms)

    async def heartbeat_many(self, leases: Sequence[tuple[int, str]], lease_ms: int) -> set[int]:
        return await leasing.heartbeat_many(self.store, leases, lease_ms)

    async def still_held(self, leases: dict[int, str]) -> set[int]:
        async with self.store.read() as conn:
            found = await data.held_leases(conn, leases)
        return {i for i, (state, token) in found.items() if state == "processing" and token == leases[i]}

    async def create(self, queue: str, fields: dict[str, Any]) -> dict[str, Any]:
        item, _ = await service.create(self.store, self.cfg, queue, fields)
        return item

    async def children(self, item_id: str, name: str | None) -> list[dict[str, Any]]:
        found, _ = await service.children(self.store, item_id, name, 1000, None)
        return found

    async def apply_queue_settings(self, settings: dict[str, dict[str, Any]]) -> dict[str, service.Changes]:
        return await service.apply_queue_settings(self.store, self.cfg, settings)


class _Nap:
    """A wake-up that never comes: over HTTP nothing signals, so a wait is a plain sleep."""

    async def wait(self, timeout_s: float) -> bool:
        await asyncio.sleep(min(timeout_s, 3600.0))
        return False


LONG_POLL_MS = 2000
"""How long one lease over HTTP waits for work. A stop waits for the lease in flight (items it took are run,
not orphaned), so this bounds how long a stop can wait on it."""
QUEUE_REFRESH_S = 5.0
"""How often a worker over HTTP reads its queues' settings (lease and processing timeout)."""
RELEASE_RETRY_MAX_S = 5.0


def release_body(outcome: outcomes.Outcome) -> dict[str, Any]:
    """An outcome as ``POST /v1/interactions/{id}/release`` takes it (API.md §3)."""
    if isinstance(outcome, outcomes.Complete):
        return {"complete": {"result": outcome.result}}
    if isinstance(outcome, outcomes.Fail | outcomes.Retry):
        failed: dict[str, Any] = {"error": outcome.error}
        if outcome.detail is not None:
            failed["error_detail"] = outcome.detail
        return {"fail" if isinstance(outcome, outcomes.Fail) else "retry": failed}
    if isinstance(outcome, outcomes.Repeat):
        return {"repeat": {"at": format_time(outcome.at)} if outcome.at is not None else {"in_ms": outcome.in_ms or 0}}
    return {"wait": {}}


class HttpQueues:
    """A server's HTTP API: ``POST /v1/queues/{queue}/lease`` with ``wait_ms``, heartbeats and releases per
    item (sent together), with the token's ``queues:<queue>`` scope. Nothing here opens the store."""

    long_polls = True

    def __init__(self, client: AsyncInteractionsClient, *, long_poll_ms: int = LONG_POLL_MS) -> None:
        self.client = client
        self.long_poll_ms = long_poll_ms
        self._queues: dict[str, tuple[float, dict[str, Any]]] = {}
        # A batch heartbeat names its queue; the worker's runtime beats by item.
        self._queue_of_leases: dict[int, str] = {}

    def waiter(self, channel: str) -> Wakeup:
        return _Nap()

    def interaction(self, item: dict[str, object] | Interaction) -> Interaction:
        # What a server answered: checked (``lease`` answers models it validated).
        return item if isinstance(item, Interaction) else Interaction.model_validate(item)

    def until_next(self, next_due: int | None) -> float:
        return 0.0

    async def _queue(self, queue: str) -> dict[str, Any]:
        """The queue's settings as the server has them, read again every ``QUEUE_REFRESH_S``."""
        loop = asyncio.get_running_loop()
        read_at, settings = self._queues.get(queue, (float("-inf"), {}))
        if loop.time() - read_at >= QUEUE_REFRESH_S:
            settings = dict(await self.client.get_queue(queue))
            self._queues[queue] = (loop.time(), settings)
        return settings

    async def lease(self, queue: str, worker: str, max_items: int, lease_ms: int | None) -> Leased:
        """The call ``AsyncInteractionsClient.lease`` makes, its answer read straight into models: pydantic reading
        the JSON itself costs about what ``json.loads`` alone does, half of ``json.loads`` and a ``model_validate``
        per item (every item is still checked). ``Leased.items`` are these models (``interaction`` takes them)."""
        settings = await self._queue(queue)
        fields = without_unset(worker=worker, max=max_items, lease_ms=lease_ms, wait_ms=self.long_poll_ms)
        reply = await self.client._request("POST", f"{queue_path(queue)}/lease", idempotent=False, json=fields, wait_ms=self.long_poll_ms)
        items = InteractionList.model_validate_json(reply.content).interactions
        self._queue_of_leases.update((int(i.id), queue) for i in items)
        return Leased(cast(list[dict[str, Any]], items), None, settings.get("processing_timeout_ms"), lease_ms or settings.get("lease_ms"))

    def releases_with_lease(self, queue: str) -> bool:
        return False  # the API has no route that does both: releases go on their own, beside the long polls

    async def release_and_lease(
        self, queue: str, worker: str, releases: Sequence[Release], max_items: int, lease_ms: int | None
    ) -> tuple[list[bool], Leased]:
        """Two calls: the API has no route that does both."""
        held = await self.release_many(queue, releases)
        return held, await self.lease(queue, worker, max_items, lease_ms)

    async def release_many(self, queue: str, releases: Sequence[Release]) -> list[bool]:
        """The batch in one call (``POST /v1/queues/{queue}/release``), sent again while the server cannot be
        reached (a release is fenced by its token: a repeat of one that was stored changes nothing); if the
        server refuses the batch (an outcome it cannot store), each is released alone."""
        if not releases:
            return []
        try:
            try:
                # Written as JSON once, with the call: a result that is not JSON is found then (nothing sent).
                return await self._release_batch(queue, [(str(i), token, release_body(outcome)) for i, token, outcome in releases])
            except (TypeError, ValueError):
                return await self._release_batch(queue, [(str(i), token, _storable_body(outcome)) for i, token, outcome in releases])
        except InvalidRequest:
            return list(await asyncio.gather(*(self._release(item_id, token, outcome) for item_id, token, outcome in releases)))
        finally:
            for item_id, _, _ in releases:
                self._queue_of_leases.pop(item_id, None)

    async def _release_batch(self, queue: str, batch: list[tuple[str, str, dict[str, Any]]]) -> list[bool]:
        attempt = 0
        while True:
            attempt += 1
            try:
                released = set((await self.client.release_many(queue, batch))["released"])
                return [i in released for i, _, _ in batch]
            except ServiceUnavailable as exc:
                log_failure(log, exc, "releasing %d items failed (attempt %d); retrying", len(batch), attempt)
                await asyncio.sleep(min(RELEASE_RETRY_MAX_S, 0.05 * 2**attempt))

    async def _release(self, item_id: int, token: str, outcome: outcomes.Outcome) -> bool:
        """One release, sent again while the server cannot be reached: a release is fenced by its token, so
        a repeat of one that was stored changes nothing (it answers ``lease_lost``)."""
        body = _storable_body(outcome)
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.client.release(str(item_id), token, body)
                return True
            except LeaseLost:
                return False
            except InvalidRequest as exc:
                # What the server refuses to store (a result too deep, text with NUL) fails the item.
                body = {"fail": {"error": f"the server refused the handler's outcome: {exc.detail}"[:10_000]}}
            except ServiceUnavailable as exc:
                log_failure(log, exc, "releasing #%s failed (attempt %d); retrying", item_id, attempt)
                await asyncio.sleep(min(RELEASE_RETRY_MAX_S, 0.05 * 2**attempt))

    async def heartbeat_many(self, leases: Sequence[tuple[int, str]], lease_ms: int) -> set[int]:
        """One call per queue (``POST /v1/queues/{queue}/heartbeat``)."""
        by_queue: dict[str, list[tuple[int, str]]] = {}
        for item_id, token in leases:
            by_queue.setdefault(self._queue_of_leases[item_id], []).append((item_id, token))
        kept: set[int] = set()
        for queue, group in by_queue.items():
            try:
                held = set((await self.client.heartbeat_many(queue, [(str(i), t) for i, t in group], lease_ms=lease_ms))["held"])
            except ServiceUnavailable as exc:
                # Unreachable for now: the leases may well be held still, and the next beat will tell.
                log_failure(log, exc, "the heartbeat of %d leases failed; trying again at the next", len(group))
                kept.update(i for i, _ in group)
                continue
            kept.update(i for i, _ in group if str(i) in held)
        for item_id, _ in leases:
            if item_id not in kept:
                self._queue_of_leases.pop(item_id, None)
        return kept

    async def still_held(self, leases: dict[int, str]) -> set[int]:
        return set(leases)

    async def create(self, queue: str, fields: dict[str, Any]) -> dict[str, Any]:
        given = dict(fields)
        due_at = given.pop("due_at", None)
        if due_at is not None:
            given["process_at"] = format_time(due_at)
        if given.get("parent_id") is not None:
            given["parent_id"] = str(given["parent_id"])
        return dict(await self.client.create(queue, **given))

    async def children(self, item_id: str, name: str | None) -> list[dict[str, Any]]:
        page = await self.client.children(item_id, name, limit=1000)
        return [dict(i) for i in page["interactions"]]

    async def apply_queue_settings(self, settings: dict[str, dict[str, Any]]) -> dict[str, service.Changes]:
        changed: dict[str, service.Changes] = {}
        for queue, given in settings.items():
            current = {k: v for k, v in (await self.client.get_queue(queue)).items() if k in QueueSettingsIn.model_fields}
            merged, changes = service.merge_queue_settings(current, given)
            if changes:
                await self.client.put_queue(queue, **merged)
                changed[queue] = changes
        return changed


def _storable_body(outcome: outcomes.Outcome) -> dict[str, Any]:
    """The outcome as the API takes it; a result that is not JSON fails the item instead."""
    try:
        body = release_body(outcome)
        json.dumps(body, allow_nan=False)
    except (TypeError, ValueError) as exc:
        body = {"fail": {"error": f"the handler's result cannot be stored as JSON: {exc}"[:10_000]}}
    return body
