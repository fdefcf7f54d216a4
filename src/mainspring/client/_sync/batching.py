# Generated from client/_async by scripts/sync_clients.py: edit that file, not this one.
"""The batching client (API.md §4): batchers, tasks, packages and the version log."""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Iterable, Mapping
from typing import Literal, cast
from urllib.parse import quote

from mainspring.client._sync.base import body
from mainspring.client._sync.events import EventsClient
from mainspring.client.models import Batcher, Package, PackagePage, Task, Version
from mainspring.types import JsonInput


def _batcher(name: str) -> str:
    return f"/v1/batchers/{quote(name, safe='')}"


def _package(package_id: str) -> str:
    return f"/v1/packages/{quote(package_id, safe='')}"


def _results(results: Mapping[str, JsonInput] | Iterable[Mapping[str, JsonInput]] | None) -> JsonInput:
    """``results`` as the API takes them: a map task id → result, or a list of per-task outcomes."""
    if results is None or isinstance(results, Mapping):
        return None if results is None else dict(results)
    return [dict(r) for r in results]


class BatchingClient(EventsClient):
    """Every call of the batching face. Errors raise ``mainspring.MainspringError`` subclasses with the
    problem's ``code`` (``task_not_found``, ``lease_lost``…)."""

    def put_batcher(
        self,
        name: str,
        *,
        min_size: int | None = None,
        max_size: int | None = None,
        linger_ms: int | None = None,
        max_wait_ms: int | None = None,
        group_size: int | None = None,
        incomplete_group: Literal["reject", "carry"] | None = None,
        lease_ms: int | None = None,
    ) -> Batcher:
        """Store the settings of batcher ``name`` (created if new); they apply to its next batch."""
        settings = body(min_size=min_size, max_size=max_size, linger_ms=linger_ms, max_wait_ms=max_wait_ms,
                        group_size=group_size, incomplete_group=incomplete_group, lease_ms=lease_ms)
        return cast(Batcher, self._json("PUT", _batcher(name), idempotent=True, json=settings))

    def get_batcher(self, name: str) -> Batcher:
        """The settings of batcher ``name``, its forming batch and its counts."""
        return cast(Batcher, self._json("GET", _batcher(name), idempotent=True))

    def delete_batcher(self, name: str, force: bool = False) -> None:
        """Delete batcher ``name`` with its tasks, packages and version log. ``Conflict`` (code
        ``batcher_busy``) while a package of it is claimed under a live lease, unless ``force``;
        ``NotFound`` (code ``batcher_not_found``) when there is no such batcher."""
        params = {"force": "true"} if force else None
        self._json("DELETE", _batcher(name), idempotent=True, params=params)

    def submit(self, name: str, *, id: str, group: str, member: str, content: JsonInput, data: JsonInput = None) -> Task:
        """Submit a task; its ``status`` says ``pending`` (accepted) or ``rejected`` (``reason`` duplicate).
        ``id`` makes the call idempotent, so it is retried safely."""
        fields = body(id=id, group=group, member=member, content=content, data=data)
        return cast(Task, self._json("POST", f"{_batcher(name)}/tasks", idempotent=True, json=fields))

    def task(self, name: str, task_id: str) -> Task:
        """A task: its status, version, package and, once finished, its result or error."""
        path = f"{_batcher(name)}/tasks/{quote(task_id, safe='')}"
        return cast(Task, self._json("GET", path, idempotent=True))

    def claim(self, name: str, worker: str, lease_ms: int | None = None, wait_ms: int | None = None) -> Package | None:
        """Claim the oldest ready package of ``name`` with a lease (``package["lease"]["token"]``), or None
        when none was waiting within ``wait_ms``."""
        fields = body(worker=worker, lease_ms=lease_ms, wait_ms=wait_ms)
        path = f"{_batcher(name)}/packages/claim"
        return cast("Package | None", self._json("POST", path, idempotent=False, json=fields, wait_ms=wait_ms))

    def heartbeat(self, package_id: str, token: str, lease_ms: int | None = None) -> Package:
        """Extend the lease of a claimed package; ``LeaseLost`` when it was taken over."""
        path = f"{_package(package_id)}/heartbeat"
        return cast(Package, self._json("POST", path, idempotent=True, json=body(token=token, lease_ms=lease_ms)))

    def complete(self, package_id: str, token: str,
                       results: Mapping[str, JsonInput] | Iterable[Mapping[str, JsonInput]] | None = None) -> Package:
        """Finish a claimed package. ``results``: a map task id → result, or a list of ``{"task_id",
        "status": "done"|"failed", "result"?, "error"?}``; a task left out is done. Repeats answer the same."""
        path = f"{_package(package_id)}/complete"
        return cast(Package, self._json("POST", path, idempotent=True, json={"token": token, "results": _results(results)}))

    def fail(self, package_id: str, token: str, error: str, retry: bool = False) -> Package:
        """Give a claimed package up: back to the cafe with ``retry``, else failed with its tasks."""
        path = f"{_package(package_id)}/fail"
        fields = {"token": token, "error": error, "retry": retry}
        return cast(Package, self._json("POST", path, idempotent=False, json=fields))

    def package(self, package_id: str) -> Package:
        """A package with its tasks."""
        return cast(Package, self._json("GET", _package(package_id), idempotent=True))

    def packages(self, name: str, status: Literal["ready", "claimed", "done", "failed"] | None = None,
                       limit: int = 100, cursor: str | None = None) -> PackagePage:
        """One page of ``name``'s packages, oldest first."""
        params = {"status": status, "limit": limit, "cursor": cursor}
        return cast(PackagePage, self._json("GET", f"{_batcher(name)}/packages", idempotent=True, params=params))

    def iterate_packages(self, name: str,
                               status: Literal["ready", "claimed", "done", "failed"] | None = None) -> Iterator[Package]:
        """Every package of ``name`` (of ``status``), page by page."""
        cursor: str | None = None
        while True:
            page = self.packages(name, status, 500, cursor)
            for package in page["packages"]:
                yield package
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def versions(self, name: str, group: str, member: str) -> builtins.list[Version]:
        """The permanent version log of one group member, oldest first."""
        path = f"{_batcher(name)}/versions/{quote(group, safe='')}/{quote(member, safe='')}"
        return cast(dict[str, builtins.list[Version]], self._json("GET", path, idempotent=True))["versions"]

    def group_versions(self, name: str, group: str) -> dict[str, builtins.list[Version]]:
        """Every member's version log of one group in one call (both books of a pair), by member."""
        path = f"{_batcher(name)}/versions/{quote(group, safe='')}"
        return cast(dict[str, dict[str, builtins.list[Version]]], self._json("GET", path, idempotent=True))["members"]
