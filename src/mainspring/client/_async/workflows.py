"""The workflows client (API.md §5): start runs, read them, wait for their result, signal, cancel, retry."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import cast
from urllib.parse import quote

from mainspring.client._async.base import AsyncBaseClient, body
from mainspring.client.errors import WorkflowCancelled, WorkflowFailed
from mainspring.client.models import WorkflowRun, WorkflowRunPage, WorkflowSummary
from mainspring.types import JsonData, JsonInput

FINISHED = ("completed", "failed", "cancelled")
LONG_POLL_MS = 30_000


def _runs(name: str, run_id: str | None = None) -> str:
    path = f"/v1/workflows/{quote(name, safe='')}/runs"
    return path if run_id is None else f"{path}/{quote(run_id, safe='')}"


class AsyncWorkflowsClient(AsyncBaseClient):
    """Every call of workflows. ``start`` is idempotent by ``id`` (a repeat answers the existing run), so it is
    retried safely when an ``id`` is given."""

    async def workflows(self) -> list[WorkflowSummary]:
        """Every workflow the server's app registers, with its runs counted by status."""
        return cast(dict[str, list[WorkflowSummary]], await self._json("GET", "/v1/workflows", idempotent=True))["workflows"]

    async def start(self, name: str, args: JsonInput = None, id: str | None = None) -> WorkflowRun:
        """Start a run of workflow ``name`` (``id``: default a new uuid); the existing run when ``id`` exists."""
        return cast(WorkflowRun, await self._json("POST", _runs(name), idempotent=id is not None, json=body(id=id, args=args)))

    async def get(self, name: str, id: str, *, wait_ms: int | None = None) -> WorkflowRun:
        """A run with its steps (``wait_ms``: once it finishes or the wait ends, at most 60,000)."""
        return cast(WorkflowRun, await self._json("GET", _runs(name, id), idempotent=True, params={"wait_ms": wait_ms}, wait_ms=wait_ms))

    async def result(self, name: str, id: str, timeout_s: float | None = None) -> JsonData:
        """The run's result once it completes; ``WorkflowFailed`` or ``WorkflowCancelled`` when it ends otherwise,
        ``TimeoutError`` when ``timeout_s`` passes first (None: wait as long as it takes)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left_ms = LONG_POLL_MS if deadline is None else int(max(0.0, deadline - time.monotonic()) * 1000)
            run = await self.get(name, id, wait_ms=min(LONG_POLL_MS, left_ms))
            if run["status"] == "completed":
                return run["result"]
            if run["status"] == "failed":
                raise WorkflowFailed(run)
            if run["status"] == "cancelled":
                raise WorkflowCancelled(run)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {id!r} of {name!r} is still {run['status']}")

    async def signal(self, name: str, id: str, signal: str, payload: JsonInput = None) -> None:
        """Send signal ``signal`` with ``payload``; kept, in order, until a wait takes it."""
        await self._json("POST", f"{_runs(name, id)}/signals/{quote(signal, safe='')}", idempotent=False, json={"payload": payload})

    async def cancel(self, name: str, id: str) -> WorkflowRun:
        """Cancel a run: its code gets CancelledError at its current await; answers it (``cancelled``)."""
        return cast(WorkflowRun, await self._json("POST", f"{_runs(name, id)}/cancel", idempotent=False))

    async def retry(self, name: str, id: str) -> WorkflowRun:
        """Resume a failed run from its records."""
        return cast(WorkflowRun, await self._json("POST", f"{_runs(name, id)}/retry", idempotent=False))

    async def page(self, name: str, *, status: str | None = None, limit: int = 100, cursor: str | None = None) -> WorkflowRunPage:
        """One page of a workflow's runs (without their steps)."""
        params = {"status": status, "limit": limit, "cursor": cursor}
        return cast(WorkflowRunPage, await self._json("GET", _runs(name), idempotent=True, params=params))

    async def list(self, name: str, *, status: str | None = None, limit: int = 100) -> AsyncIterator[WorkflowRun]:
        """Every run of the workflow (of ``status``), ``limit`` a page."""
        cursor: str | None = None
        while True:
            page = await self.page(name, status=status, limit=limit, cursor=cursor)
            for run in page["runs"]:
                yield run
            cursor = page.get("cursor")
            if not cursor:
                return
