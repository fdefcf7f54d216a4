"""Read-only views the dashboard needs and no face's API offers (counts across names, lists of names,
throughput from the event log). Writes never happen here: every action calls the face's own service."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from mainspring.batching import cafe as batching_cafe
from mainspring.batching import service as batching_service
from mainspring.core import outbox
from mainspring.core.runtime import Context
from mainspring.exchange import service as exchange_service
from mainspring.interactions import service as interactions_service
from mainspring.machines import service as machines_service
from mainspring.store import format_time

MINUTE_MS = 60_000
# Event type prefixes per face, for the throughput charts.
FACE_EVENTS = {
    "exchange": "exchange.",
    "machines": "machine.",
    "interactions": "interaction.",
    "batching": "batch.",
}


async def face_counts(ctx: Context) -> dict[str, Mapping[str, Mapping[str, int | str]]]:
    """Per face, the things it holds counted by state."""
    return {
        "exchange": await exchange_service.count_by_state(ctx),
        "machines": {"machines": await machines_service.count_by_status(ctx)},
        "interactions": {"interactions": _labelled(await interactions_service.count_by_status(ctx.store))},
        "batching": await batching_service.count_by_status(ctx.store),
    }


class EstimatedCounts(Protocol):
    """Counts by status over all queues, some of them estimated (the interactions face's)."""

    def estimated_statuses(self) -> Iterable[str]: ...

    def total(self) -> Mapping[str, int]: ...


def _labelled(counted: EstimatedCounts) -> dict[str, int | str]:
    """Interactions by status over all queues, an estimated count shown as such (``~n``)."""
    estimated = set(counted.estimated_statuses())
    return {status: f"~{n}" if status in estimated else n for status, n in counted.total().items()}


def _series(minutes: int, by_bucket: dict[int, float] | dict[int, int]) -> list[int]:
    values = [0] * minutes
    for index, value in by_bucket.items():
        values[min(minutes - 1, max(0, index))] += round(value)
    return values


async def throughput(ctx: Context, minutes: int = 60) -> dict[str, list[int]]:
    """Per face, events written in each of the last ``minutes`` clock minutes (oldest first, the current one
    last), from the counts kept with the writes."""
    first = (ctx.store.now_ms() // MINUTE_MS - minutes + 1) * MINUTE_MS
    counted = await outbox.count_per_minute(ctx.store, first)
    per_face: dict[str, dict[int, int]] = {face: {} for face in FACE_EVENTS}
    for (minute, type_), n in counted.items():
        for face, prefix in FACE_EVENTS.items():
            if type_.startswith(prefix):
                index = (minute - first) // MINUTE_MS
                per_face[face][index] = per_face[face].get(index, 0) + n
    return {face: _series(minutes, by_minute) for face, by_minute in per_face.items()}


async def latency(ctx: Context, minutes: int = 60) -> dict[str, list[int]]:
    """Per face, the mean time from accepted to finished (ms) of what finished in each of the last
    ``minutes``: exchange processes (started → done), interactions (created → finished), batching
    packages (created → done). Machines have no end to measure."""
    now = ctx.store.now_ms()
    since = now - minutes * MINUTE_MS
    return {
        "exchange": _series(minutes, await exchange_service.mean_cycle_by_bucket(ctx, since, now, MINUTE_MS)),
        "batching": _series(minutes, await batching_service.mean_package_time_by_bucket(ctx.store, since, now, MINUTE_MS)),
        "interactions": _series(minutes, await interactions_service.mean_latency_by_bucket(ctx.store, since, now, MINUTE_MS)),
    }


async def queue_names(ctx: Context) -> list[str]:
    return sorted(set(await interactions_service.queue_names(ctx.store)) | set(getattr(ctx.registry, "queues", {})))


async def interaction_ancestors(ctx: Context, parent_id: str | None, depth: int = 20) -> list[dict[str, object]]:
    """The chain of parents above an interaction, nearest first."""
    return await interactions_service.ancestors(ctx.store, parent_id, depth)


async def batcher_names(ctx: Context) -> list[str]:
    return await batching_service.batcher_names(ctx.store)


async def forming_batch(ctx: Context, name: str, limit: int = 100) -> list[dict[str, object]]:
    """The pending tasks of a batcher: the batch being formed, oldest first."""
    return [
        {"id": t.id, "group": t.group, "member": t.member, "version": t.version, "created_at": format_time(t.created_at)}
        for t in await batching_service.forming_batch(ctx.store, name, limit)
    ]


async def group_versions(ctx: Context, name: str, group: str, limit: int = 200) -> list[dict[str, object]]:
    """The version log of every member of one group, oldest first."""
    return [
        {"member": r.member, "version": r.version, "sha256": r.sha256, "task_id": r.task_id, "at": format_time(r.at),
         "withdrawn_at": format_time(r.withdrawn_at)}
        for r in (await batching_service.group_log(ctx.store, name, group))[:limit]
    ]


async def package_leases(ctx: Context, name: str) -> dict[str, dict[str, object]]:
    """Who holds each claimed package and until when (never the lease token)."""
    return {
        lease.package_id: {"worker": lease.worker, "expires_at": format_time(lease.expires_at), "lease_ms": lease.lease_ms}
        for lease in await batching_cafe.package_leases(ctx.store, name)
    }
