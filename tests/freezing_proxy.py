"""A loopback TCP proxy for tests whose connections can die silently: `freeze()` stops
forwarding on every connection open at that moment without closing it (a peer powered off,
a partition: no FIN, no RST), while later connections forward as before."""

from __future__ import annotations

import asyncio
import contextlib


class FreezingProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._frozen: set[asyncio.Event] = set()  # the stop flag of each open connection
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.connections = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        """Every connection open now stops forwarding, both ways, and stays open."""
        for stop in self._frozen:
            stop.set()
        self._frozen = set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        self._writers += [writer, up_writer]
        stop = asyncio.Event()
        self._frozen.add(stop)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.ensure_future(self._pipe(src, dst, stop))
            self._tasks.add(task)

    @staticmethod
    async def _pipe(
        src: asyncio.StreamReader, dst: asyncio.StreamWriter, stop: asyncio.Event
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while not stop.is_set():
                read = asyncio.ensure_future(src.read(65536))
                stopped = asyncio.ensure_future(stop.wait())
                await asyncio.wait({read, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if stop.is_set():
                    read.cancel()
                    stopped.cancel()
                    await asyncio.Event().wait()  # frozen: hold both sockets open, forever
                stopped.cancel()
                data = read.result()
                if not data:
                    dst.close()
                    return
                dst.write(data)
                await dst.drain()
