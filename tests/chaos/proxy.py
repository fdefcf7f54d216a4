"""A small asyncio TCP proxy between clients and one server, which the nemesis uses to cut and stall links."""

from __future__ import annotations

import asyncio
import contextlib

from tests.conftest import free_port


class Proxy:
    """Forwards ``127.0.0.1:<port>`` to ``127.0.0.1:<target_port>``.

    ``drop()`` resets every open connection (clients see a reset mid-request, the server a vanished peer);
    ``stall(s)`` stops forwarding bytes both ways (and accepting new ones) for ``s`` seconds, so requests hang
    and client timeouts fire while the server may already have acted.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)
        return self

    async def unlisten(self) -> None:
        """Refuse new connections (as the dead server behind would) and reset the open ones, so a client
        knows a refused request never reached the server instead of seeing it vanish after it was sent."""
        if self._server:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.drop()

    async def listen(self) -> None:
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        if self._server:
            self._server.close()
            self._server = None
        self.drop()
        self._flowing.set()

    def drop(self) -> int:
        """Reset every open connection; answers how many there were."""
        links = list(self._links)
        for client, upstream in links:
            for writer in (client, upstream):
                with contextlib.suppress(Exception):
                    writer.transport.abort()
        self._links.clear()
        return len(links)

    async def stall(self, seconds: float) -> None:
        self._flowing.clear()
        try:
            await asyncio.sleep(seconds)
        finally:
            self._flowing.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._flowing.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        link = (writer, up_writer)
        self._links.add(link)
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            self._links.discard(link)
            for w in link:
                with contextlib.suppress(Exception):
                    w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.write_eof()
