"""What the server hands a face: its context, and the loops and retries every face runs on."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from mainspring.core import tracing
from mainspring.core.errors import CannotListen
from mainspring.store import Store
from mainspring.store import counts as kept_counts
from mainspring.store.counts import CountsTable
from mainspring.store.errors import is_unavailable

log = logging.getLogger("mainspring.runtime")
T = TypeVar("T")

SHARED_PORTS = "server:shared-ports"
"""Set in ``Context.extras`` by each process of ``serve --workers N``: a port a face listens on itself (beside
the main one, which uvicorn shares) is bound by every process, with ``SO_REUSEPORT``."""


def bind_address(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A socket bound to ``host:port`` and not yet listening (uvicorn listens on it when it serves), so that a
    taken address fails the start before anything else happens, and a client is refused, not kept waiting,
    until the server is ready. ``SO_REUSEADDR`` as uvicorn sets it; ``reuse_port`` for a port every process of
    ``serve --workers N`` binds."""
    host = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except (OSError, AttributeError) as exc:  # AttributeError: no SO_REUSEPORT on this platform
        sock.close()
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}") from None
    return sock


def settle_heap() -> None:
    """Leave what start-up made (modules, classes, schemas, the app: ~115,000 objects, nearly all kept for the
    process's life) out of the garbage collector's work: a full collection walks every tracked object, and a
    busy worker's items trigger one every ~10,000 items — ~70 ms each, 3.5–7 µs of its CPU per item at best
    settings (bench/history/2026-11-29-workerloop.md); a server's Calls to remote processors spent ~15 % of
    its CPU there (py-spy, bench/history/2026-11-29-calls5.md). Start-up's garbage is collected first, so none
    of it is kept for ever. For a process of its own (``mainspring worker``, ``mainspring serve``), not for
    one that embeds a worker or a server."""
    gc.collect()
    gc.freeze()


@dataclass
class Context:
    """Everything a running face needs: settings, the store, the user's registered code, a stop signal."""

    settings: Any
    store: Store
    registry: object = None
    """The user's ``App`` (defined above the faces; each reads the registrations of its kind)."""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    extras: dict[str, Any] = field(default_factory=dict)

    def now_ms(self) -> int:
        return self.store.now_ms()

    def wait_s(self, wait_ms: int) -> float:
        """A client's long-poll wait in seconds, capped by ``server.max_wait_ms``."""
        return min(wait_ms, self.settings.server.max_wait_ms) / 1000


def log_failure(logger: logging.Logger, exc: BaseException, message: str, *args: object) -> None:
    """Log a failure that will be retried: one warning line while the store is unreachable (a database
    restart is an expected event), the whole traceback otherwise."""
    if is_unavailable(exc):
        logger.warning(message + " (store unavailable: %s)", *args, exc)
    else:
        logger.exception(message, *args)


async def retry_while_unavailable(what: str, work: Callable[[], Awaitable[T]], within_ms: int) -> T:
    """Run ``work``, again and again with backoff while the store is unreachable, for up to ``within_ms``
    (then the last error is raised). Every other error is raised at once."""
    # The first try without tenacity: a workflow run writes through here at every record, and building the
    # retrier and its attempt loop cost more than the write's own Python (py-spy, bench.workflows many).
    try:
        return await work()
    except Exception as exc:
        if not is_unavailable(exc):
            raise
    retrying = AsyncRetrying(
        retry=retry_if_exception(is_unavailable),
        stop=stop_after_delay(within_ms / 1000),
        wait=wait_exponential_jitter(initial=0.1, max=2.0),
        before_sleep=lambda state: log.warning(
            "%s: store unavailable (%s); retrying%s", what, state.outcome.exception() if state.outcome else "?",
            # The first line says how long it keeps trying, so nobody waits for the end to learn why it waits.
            f" for up to {within_ms / 1000:g} s (server.startup_wait_ms)" if state.attempt_number == 1 else ""),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await work()
    raise AssertionError("unreachable")  # AsyncRetrying either returns or raises


async def run_loop(
    ctx: Context,
    name: str,
    step: Callable[[], Awaitable[int | None]],
    *,
    channel: str,
    poll_ms: int | None = None,
) -> None:
    """Run ``step`` until the server stops.

    ``step`` does one round of work and answers the epoch ms when it next has something due (or None).
    Between rounds the loop sleeps until that time, a wake-up on ``channel``, or the poll interval,
    whichever is first. An error is logged and retried with backoff; it never stops the loop.
    """
    poll_s = (poll_ms or ctx.settings.server.poll_interval_ms) / 1000
    failures = 0
    while not ctx.stopping.is_set():
        waiter = ctx.store.notifier.waiter(channel)
        try:
            with tracing.span(f"step {name}"):
                due = await step()
            failures = 0
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures += 1
            log_failure(log, exc, "background loop %s failed (attempt %d); retrying", name, failures)
            due = None
            await _sleep_or_stop(ctx, min(poll_s, 0.05 * 2**failures))
            continue
        timeout = poll_s
        if due is not None:
            timeout = max(0.0, min(poll_s, (due - ctx.now_ms()) / 1000))
        if timeout <= 0:
            await asyncio.sleep(0)
            continue
        stop_task = asyncio.ensure_future(ctx.stopping.wait())
        wait_task = asyncio.ensure_future(waiter.wait(timeout))
        try:
            await asyncio.wait({stop_task, wait_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_task.cancel()
            wait_task.cancel()


async def _sleep_or_stop(ctx: Context, seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            await ctx.stopping.wait()
    except TimeoutError:
        pass


async def fold_kept_counts(ctx: Context, tables: Sequence[CountsTable]) -> None:
    """PostgreSQL: fold the rows of gone backends in the faces' kept counts (``store.counts.fold``) every
    retention interval, so the tables stay as small as the number of live connections."""
    if not ctx.store.dialect.counts_per_connection or not tables:
        return

    async def step() -> int | None:
        for table in tables:
            async with ctx.store.transaction() as tx:
                await kept_counts.fold(tx, table)
        return None

    await run_loop(ctx, "kept-counts", step, channel="kept-counts", poll_ms=ctx.settings.server.retention_interval_ms)
