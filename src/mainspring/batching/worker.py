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
from dataclasses import dataclass
from typing import Any

from mainspring.batching import cafe
from mainspring.batching.service import ensure_batcher
from mainspring.core.errors import LeaseLost
from mainspring.core.runtime import Context, log_failure

log = logging.getLogger("mainspring.batching.worker")


@dataclass(frozen=True)
class BatchTask:
    """One task of a package: its id, group and member, version, content and data."""

    id: str
    group: str
    member: str
    version: int | None
    sha256: str
    content: Any
    data: Any


@dataclass(frozen=True)
class BatchPackage:
    """What a batch worker receives: one package, all of its tasks."""

    id: str
    batcher: str
    attempts: int
    tasks: list[BatchTask]

    @classmethod
    def from_api(cls, package: dict[str, Any]) -> BatchPackage:
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


async def _call(target: Any, package: BatchPackage) -> Any:
    if inspect.iscoroutinefunction(target):
        return await target(package)
    result = await asyncio.to_thread(target, package)
    if inspect.isawaitable(result):
        result = await result
    return result


async def _keep_alive(ctx: Context, package_id: str, token: str, lease_ms: int) -> None:
    while True:
        await asyncio.sleep(max(lease_ms / 3000, 0.05))
        try:
            await cafe.heartbeat_package(ctx.store, package_id, token, lease_ms)
        except LeaseLost:
            log.warning("lost the lease of package %s while working on it", package_id)
            return
        except Exception:
            log.exception("heartbeat of package %s failed; retrying", package_id)


async def work_on(ctx: Context, name: str, registration: Any, package: dict[str, Any]) -> None:
    """Run the handler on one claimed package and finish it (complete, retry or fail)."""
    token = package["lease"]["token"]
    lease_ms = int(registration.options.get("lease_ms") or 60_000)
    max_attempts = int(registration.options.get("max_attempts", 3))
    keeper = asyncio.create_task(_keep_alive(ctx, package["id"], token, lease_ms))
    try:
        try:
            results = await _call(registration.target, BatchPackage.from_api(package))
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        await cafe.complete_package(ctx.store, package["id"], token, results)
    except LeaseLost:
        log.warning("package %s was taken over before it was finished here", package["id"])
    except Exception as exc:
        retry = package["attempts"] < max_attempts
        log.exception("batch worker %s failed on package %s (attempt %d)", name, package["id"], package["attempts"])
        with contextlib.suppress(LeaseLost):
            await cafe.fail_package(ctx.store, package["id"], token, f"{type(exc).__name__}: {exc}"[:2000], retry)


async def run_worker(ctx: Context, name: str, registration: Any, index: int) -> None:
    worker = f"{socket.gethostname()}:{os.getpid()}:{name}:{index}"
    lease_ms = registration.options.get("lease_ms")
    failures = 0
    while not ctx.stopping.is_set():
        try:
            package = await cafe.claim(
                ctx.store, name, worker, lease_ms, ctx.settings.batching.worker_poll_ms, ctx.settings.server.poll_interval_ms
            )
            failures = 0
        except Exception as exc:
            failures += 1
            log_failure(log, exc, "claiming from batcher %s failed; retrying", name)
            await asyncio.sleep(min(5.0, 0.05 * 2**failures))
            continue
        if package is not None:
            await work_on(ctx, name, registration, package)


async def workers_loop(ctx: Context) -> None:
    """Run every registered batcher's workers until the server stops."""
    runners = [
        asyncio.create_task(run_worker(ctx, name, registration, i), name=f"batcher:{name}:{i}")
        for name, registration in registered(ctx).items()
        for i in range(int(registration.options.get("concurrency", 1)))
    ]
    if not runners:
        return
    try:
        await asyncio.gather(*runners)
    finally:
        for runner in runners:
            runner.cancel()
