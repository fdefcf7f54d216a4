"""In-process workers for ``@app.batcher("books")``: each receives whole packages.

```python
@app.batcher("books", concurrency=2, min_size=2, max_size=6)
async def translate(package: BatchPackage) -> dict[str, object] | None:
    for task in package.tasks: ...
    return {task.id: {"pages": 12} for task in package.tasks}   # or None: every task done
```
The function may be sync (it then runs in a thread). Options: ``concurrency`` (workers, default 1),
``max_attempts`` (default 3: a raise gives the package back to the cafe until then, and fails it after),
``lease_ms``; and the batcher's settings (``min_size`` …) used when the batcher is first created.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from mainspring.batching import cafe
from mainspring.batching.service import ensure_batcher
from mainspring.client._async.batching import AsyncBatchingClient
from mainspring.client.errors import ServiceUnavailable
from mainspring.core.errors import LeaseLost
from mainspring.core.runtime import Context, log_failure
from mainspring.store.errors import is_unavailable
from mainspring.types import JsonData

log = logging.getLogger("mainspring.batching.worker")


@dataclass(frozen=True)
class BatchTask:
    """One task of a package: its id, group and member, version, content and data."""

    id: str
    group: str
    member: str
    version: int | None
    sha256: str
    content: JsonData
    data: JsonData


@dataclass(frozen=True)
class BatchPackage:
    """What a batch worker receives: one package, all of its tasks."""

    id: str
    batcher: str
    attempts: int
    tasks: list[BatchTask]

    @classmethod
    def from_api(cls, package: Mapping[str, Any]) -> BatchPackage:
        tasks = [
            BatchTask(t["id"], t["group"], t["member"], t["version"], t["sha256"], t["content"], t["data"])
            for t in package["tasks"]
        ]
        return cls(package["id"], package["batcher"], package["attempts"], tasks)


def registered(ctx: Context) -> dict[str, Any]:
    return dict(getattr(ctx.registry, "batchers", None) or {})


async def recover(ctx: Context) -> None:
    """Create the registered batchers (with their options) that do not exist yet; stored settings win."""
    for name, registration in registered(ctx).items():
        async with ctx.store.transaction() as tx:
            await ensure_batcher(tx, name, dict(registration.options))


async def _call(target: Callable[[BatchPackage], object], package: BatchPackage) -> object:
    if inspect.iscoroutinefunction(target):
        return await target(package)
    result = await asyncio.to_thread(target, package)
    if inspect.isawaitable(result):
        result = await result
    return result


class PackageSource(Protocol):
    """Where a batch worker claims packages and finishes them: the store (``StoreCafe``) or a server's HTTP
    API (``HttpCafe``, a worker without database credentials). Both fence every write by the lease token."""

    async def claim(self, name: str, worker: str, lease_ms: int | None) -> Mapping[str, Any] | None:
        """A claimed package (waiting a while for one), or None."""

    async def heartbeat(self, package_id: str, token: str, lease_ms: int) -> None: ...

    async def complete(self, package_id: str, token: str, results: object) -> None: ...

    async def fail(self, package_id: str, token: str, error: str, retry: bool) -> None: ...


class StoreCafe:
    """The store itself, woken by its notifier while it waits for a package."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def claim(self, name: str, worker: str, lease_ms: int | None) -> Mapping[str, Any] | None:
        settings = self.ctx.settings
        return await cafe.claim(self.ctx.store, name, worker, lease_ms, settings.batching.worker_poll_ms, settings.server.poll_interval_ms)

    async def heartbeat(self, package_id: str, token: str, lease_ms: int) -> None:
        await cafe.heartbeat_package(self.ctx.store, package_id, token, lease_ms)

    async def complete(self, package_id: str, token: str, results: object) -> None:
        await _until_sent(lambda: cafe.complete_package(self.ctx.store, package_id, token, results), is_unavailable, package_id)

    async def fail(self, package_id: str, token: str, error: str, retry: bool) -> None:
        await cafe.fail_package(self.ctx.store, package_id, token, error, retry)


LONG_POLL_MS = 2000
"""How long one claim over HTTP waits for a package (a stop lets the claim in flight end first)."""
FINISH_RETRY_MAX_S = 5.0


class HttpCafe:
    """A server's HTTP API: ``POST /v1/batchers/{name}/packages/claim`` with ``wait_ms``, then the package's
    heartbeat, complete or fail, with the token's ``batchers:<name>`` scope."""

    def __init__(self, client: AsyncBatchingClient, *, long_poll_ms: int = LONG_POLL_MS) -> None:
        self.client = client
        self.long_poll_ms = long_poll_ms

    async def claim(self, name: str, worker: str, lease_ms: int | None) -> Mapping[str, Any] | None:
        package = await self.client.claim(name, worker, lease_ms, wait_ms=self.long_poll_ms)
        return None if package is None else dict(package)

    async def heartbeat(self, package_id: str, token: str, lease_ms: int) -> None:
        await self.client.heartbeat(package_id, token, lease_ms)

    async def complete(self, package_id: str, token: str, results: object) -> None:
        # The handler's answer, sent as it is: the server checks its shape.
        await _until_sent(lambda: self.client.complete(package_id, token, results),  # type: ignore[arg-type]
                          lambda exc: isinstance(exc, ServiceUnavailable), package_id)

    async def fail(self, package_id: str, token: str, error: str, retry: bool) -> None:
        await self.client.fail(package_id, token, error, retry)


async def _until_sent(send: Callable[[], Awaitable[object]], unreachable: Callable[[Exception], bool], package_id: str) -> None:
    """Send a completion again while the store (or the server) cannot be reached: a repeat of a stored completion
    answers the same, and a completion that failed on the way must not give back a package whose work is done,
    to be done again."""
    attempt = 0
    while True:
        attempt += 1
        try:
            await send()
            return
        except Exception as exc:
            if not unreachable(exc):
                raise
            log_failure(log, exc, "completing package %s failed (attempt %d); retrying", package_id, attempt)
            await asyncio.sleep(min(FINISH_RETRY_MAX_S, 0.05 * 2**attempt))


async def _keep_alive(source: PackageSource, package_id: str, token: str, lease_ms: int) -> None:
    while True:
        await asyncio.sleep(max(lease_ms / 3000, 0.05))
        try:
            await source.heartbeat(package_id, token, lease_ms)
        except LeaseLost:
            log.warning("lost the lease of package %s while working on it", package_id)
            return
        except Exception as exc:
            log_failure(log, exc, "heartbeat of package %s failed; retrying", package_id)


async def work_on(source: PackageSource, name: str, registration: Any, package: Mapping[str, Any]) -> None:
    """Run the handler on one claimed package and finish it (complete, retry or fail)."""
    token = package["lease"]["token"]
    lease_ms = int(registration.options.get("lease_ms") or 60_000)
    max_attempts = int(registration.options.get("max_attempts", 3))
    keeper = asyncio.create_task(_keep_alive(source, package["id"], token, lease_ms))
    try:
        try:
            results = await _call(registration.target, BatchPackage.from_api(package))
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        await source.complete(package["id"], token, results)
    except LeaseLost:
        log.warning("package %s was taken over before it was finished here", package["id"])
    except Exception as exc:
        retry = package["attempts"] < max_attempts
        log.exception("batch worker %s failed on package %s (attempt %d)", name, package["id"], package["attempts"])
        try:
            await source.fail(package["id"], token, f"{type(exc).__name__}: {exc}"[:2000], retry)
        except LeaseLost:
            pass
        except Exception as failed:
            # Its lease runs out and the cafe hands it out again: nothing is lost.
            log_failure(log, failed, "giving package %s back failed; its lease will expire", package["id"])


async def run_worker(source: PackageSource, stopping: asyncio.Event, name: str, registration: Any, index: int) -> None:
    worker = f"{socket.gethostname()}:{os.getpid()}:{name}:{index}"
    lease_ms = registration.options.get("lease_ms")
    failures = 0
    while not stopping.is_set():
        try:
            package = await source.claim(name, worker, lease_ms)
            failures = 0
        except Exception as exc:
            failures += 1
            log_failure(log, exc, "claiming from batcher %s failed; retrying", name)
            await asyncio.sleep(min(5.0, 0.05 * 2**failures))
            continue
        if package is not None:
            await work_on(source, name, registration, package)


async def run_workers(source: PackageSource, batchers: dict[str, Any], stopping: asyncio.Event) -> None:
    """Run the workers of ``batchers`` (name → registration) on ``source`` until ``stopping`` is set."""
    runners = [
        asyncio.create_task(run_worker(source, stopping, name, registration, i), name=f"batcher:{name}:{i}")
        for name, registration in batchers.items()
        for i in range(int(registration.options.get("concurrency", 1)))
    ]
    if not runners:
        return
    try:
        await asyncio.gather(*runners)
    finally:
        for runner in runners:
            runner.cancel()


async def workers_loop(ctx: Context) -> None:
    """Run every registered batcher's workers until the server stops."""
    await run_workers(StoreCafe(ctx), registered(ctx), ctx.stopping)
