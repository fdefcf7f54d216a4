"""Wake-up signals: in-process always, PostgreSQL LISTEN/NOTIFY across servers.

A channel is a string such as ``"interactions:emails"``. Signalling it wakes its waiters and the waiters
of each prefix (``"interactions"``), so a loop can wait for "anything in my face". Signals are hints, never
the truth: every waiter re-reads the store and also wakes on its own timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

log = logging.getLogger("mainspring.store.notify")

PG_CHANNEL = "mainspring"

PAYLOAD_SEPARATOR = " "
"""Between the channels of one NOTIFY payload (names never hold a space: ``core.types.NAME_PATTERN``)."""
PAYLOAD_LIMIT = 7000
"""Bytes of channels per NOTIFY (PostgreSQL refuses payloads of 8000 bytes and more)."""


def payloads(channels: Iterable[str]) -> list[str]:
    """The wake-ups of one commit as few NOTIFY payloads as fit (one, unless they are thousands of bytes):
    each NOTIFY is a queue entry every listening backend reads."""
    found: list[str] = []
    current: list[str] = []
    size = 0
    for channel in channels:
        if current and size + len(channel) + 1 > PAYLOAD_LIMIT:
            found.append(PAYLOAD_SEPARATOR.join(current))
            current, size = [], 0
        current.append(channel)
        size += len(channel.encode()) + 1
    if current:
        found.append(PAYLOAD_SEPARATOR.join(current))
    return found


class Waiter:
    """One waiter's view of a channel, taken *before* it reads the store, so no signal slips between."""

    def __init__(self, event: asyncio.Event) -> None:
        self._event = event

    @property
    def signalled(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout_s: float) -> bool:
        """True when signalled, False on timeout."""
        if timeout_s <= 0:
            return self._event.is_set()
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation that arrives as
        # its timeout fires, and a loop waiting in short naps would then never stop.
        try:
            async with asyncio.timeout(timeout_s):
                await self._event.wait()
        except TimeoutError:
            return False
        return True


class Notifier:
    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def waiter(self, channel: str) -> Waiter:
        event = self._events.get(channel)
        if event is None:
            event = self._events[channel] = asyncio.Event()
        return Waiter(event)

    def signal(self, channel: str) -> None:
        parts = channel.split(":")
        for i in range(len(parts), 0, -1):
            key = ":".join(parts[:i])
            event = self._events.pop(key, None)
            if event is not None:
                event.set()

    def signal_all(self) -> None:
        events, self._events = self._events, {}
        for event in events.values():
            event.set()

    def signal_many(self, channels: Iterable[str]) -> None:
        for channel in channels:
            self.signal(channel)


class PostgresListener:
    """Holds one LISTEN connection and turns NOTIFY payloads into local signals.

    On every (re)connect it signals everything: notifications sent while it was away are lost, so
    waiters must look again.
    """

    def __init__(self, dsn: str, notifier: Notifier, reconnect_s: float = 1.0) -> None:
        self._dsn = dsn
        self._notifier = notifier
        self._reconnect_s = reconnect_s
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="pg-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _run(self) -> None:
        import asyncpg

        while True:
            conn = None
            try:
                conn = await asyncpg.connect(self._dsn)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(PG_CHANNEL, self._on_notify)
                self.connected.set()
                self._notifier.signal_all()
                while not lost.is_set():
                    # A cheap round trip now and then notices a half-open connection.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), 10)
                    if not lost.is_set():
                        await asyncio.wait_for(conn.fetchval("SELECT 1"), 5)
            except asyncio.CancelledError:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=1)
                raise
            except Exception as exc:
                log.warning("LISTEN connection lost (%s); reconnecting", exc)
            finally:
                self.connected.clear()
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=1)
            await asyncio.sleep(self._reconnect_s)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self._notifier.signal_many(payload.split(PAYLOAD_SEPARATOR))
