"""Wake-ups between processes on one SQLite file: what LISTEN/NOTIFY is to PostgreSQL.

Every process that started its store binds a Unix datagram socket in a folder beside the database
(``<database>.wakeups/``). A commit that names channels sends them, one datagram, to every socket there; a
socket nobody reads any more (its process died) refuses the datagram and is removed. Like NOTIFY these are
hints: a lost one costs a waiter its poll interval, never correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import socket
import tempfile
from collections.abc import Iterable
from pathlib import Path

from mainspring.store.notify import Notifier

log = logging.getLogger("mainspring.store.wakeups")

MAX_DATAGRAM = 8192


SOCKET_PATH_MAX = 100
"""Unix socket paths are short (108 bytes on Linux), with room left here for the socket's own name."""


def folder_for(database: str) -> Path:
    """Beside the database when the path is short enough, else under the temp dir by the database's hash:
    every process on one file computes the same folder."""
    beside = Path(os.path.abspath(database) + ".wakeups")
    if len(str(beside)) <= SOCKET_PATH_MAX - 20:
        return beside
    digest = hashlib.sha256(os.path.abspath(database).encode()).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / "mainspring-wakeups" / digest


class _Receiver(asyncio.DatagramProtocol):
    def __init__(self, notifier: Notifier) -> None:
        self._notifier = notifier

    def datagram_received(self, data: bytes, _addr: object) -> None:
        for channel in data.decode("utf-8", "replace").split("\n"):
            if channel:
                self._notifier.signal(channel)


class UnixWakeups:
    """This process's wake-up socket, and sending to the others'."""

    def __init__(self, database: str, notifier: Notifier) -> None:
        self.folder = folder_for(database)
        self._notifier = notifier
        self._path: Path | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sender.setblocking(False)
        self._peers: list[str] = []
        self._listed_at: int | None = None

    async def start(self) -> None:
        if self._transport is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        # Unix socket paths are short (108 bytes): name the socket briefly; the folder is beside the database.
        self._path = self.folder / f"{os.getpid()}-{secrets.token_hex(4)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(self._path))
        sock.setblocking(False)
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: _Receiver(self._notifier), sock=sock)
        self._transport = transport  # type: ignore[assignment]

    def _peer_paths(self) -> list[str]:
        """The other processes' sockets; the folder is listed again only when it changed."""
        try:
            changed = self.folder.stat().st_mtime_ns
        except FileNotFoundError:
            return []
        if changed != self._listed_at:
            own = str(self._path) if self._path else None
            self._peers = [str(p) for p in self.folder.iterdir() if str(p) != own]
            self._listed_at = changed
        return self._peers

    def send(self, channels: Iterable[str]) -> None:
        """Wake the other processes on ``channels`` (best effort, never blocks)."""
        payload = "\n".join(channels).encode()[:MAX_DATAGRAM]
        if not payload:
            return
        for peer in self._peer_paths():
            try:
                self._sender.sendto(payload, peer)
            except (ConnectionRefusedError, FileNotFoundError):
                # Nobody reads it any more: the process that bound it is gone.
                with contextlib.suppress(OSError):
                    os.unlink(peer)
            except (BlockingIOError, OSError) as exc:
                # A full queue: that process is busy and will look at the store on its own soon.
                log.debug("wake-up to %s not sent: %s", peer, exc)

    async def stop(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        if self._path is not None:
            with contextlib.suppress(OSError):
                self._path.unlink()
            self._path = None
        self._sender.close()
