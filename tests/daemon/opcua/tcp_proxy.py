"""A byte-level TCP proxy between rung and the simulated OPC UA PLC, on the test's event
loop: ``drop`` ends every connection (a dropped session), ``delay`` holds each chunk from
the server that long (a slow server), ``refuse`` closes new connections at once (a cable
pulled: each reconnect fails; ``refused`` counts them)."""

from __future__ import annotations

import asyncio
import contextlib

from rung.daemon.demo.localbroker import free_port


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.endpoint = f"opc.tcp://127.0.0.1:{self.port}/rung-sim/"
        self.delay = 0.0
        self.refuse = False
        self.connections = 0
        self.refused = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self.drop()
            await self._server.wait_closed()

    def drop(self) -> None:
        for w in list(self._writers):
            w.close()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            self.refused += 1
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self.connections += 1
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer, 0.0),
                             self._pipe(up_reader, writer, None))
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    delay: float | None) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, RuntimeError):
            while data := await reader.read(65536):
                if delay is None and self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        writer.close()
