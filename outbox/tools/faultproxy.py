"""A small fault-injecting TCP proxy, so transports are tested against real sockets
misbehaving rather than mocks.

Modes (change ``proxy.mode`` at any time; new connections follow it):

* ``pass``: forward both ways, adding ``latency`` seconds before each chunk goes upstream.
* ``blackhole``: accept, read and discard, never answer (a hung backend or firewall).
* ``reset``: forward the request, then cut the connection with a TCP reset after
  ``reset_after`` bytes of the answer (a crash mid-response).
* ``refuse``: accept and reset at once.
* ``garble``: forward the request, then answer in turn (by connection) with the backend's own
  answer one byte at a time, a head whose chunked body is malformed then a reset, or bytes that are
  no HTTP at all then a close (an HTTP client's parser against what a broken proxy sends).

``cut()`` resets the connections already open, so long-lived ones meet the new mode too.

A port with nothing listening (:func:`free_port`) plays a backend that is down.

Example::

    with FaultProxy("127.0.0.1", sink.port, mode="blackhole") as proxy:
        transport = HttpTransport(proxy.url, timeout=1.0)
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from types import TracebackType
from typing import Literal, Self

__all__ = ["FaultProxy", "free_port"]

Mode = Literal["pass", "blackhole", "reset", "refuse", "garble"]
_MALFORMED_CHUNK = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
_NOT_HTTP = b"\x16\x03\x01 this is no HTTP answer\r\n\r\n"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (right now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST instead of FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        mode: Mode = "pass",
        latency: float = 0.0,
        reset_after: int = 16,
        port: int = 0,
    ) -> None:
        self.target = (target_host, target_port)
        self.mode: Mode = mode
        self.latency = latency
        self.reset_after = reset_after
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[asyncio.Task[None]] = set()
        #: Connections accepted so far.
        self.connections = 0

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the proxy first"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", self._port)
            )
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=main, name="outbox-faultproxy", daemon=True)
        self._thread.start()
        ready.wait(5)
        return self

    def cut(self) -> None:
        """Reset every open connection now (clients that keep connections open, such as Kafka
        producers, then reconnect and meet the current mode)."""

        async def cut_all() -> None:
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cut_all(), self._loop).result(5)

    def stop(self) -> None:
        if self._thread is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        self._thread.join(5)
        self._loop.close()
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        self.connections += 1
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # cancelled: cut() or stop(); the connection is aborted below
        finally:
            self._conns.discard(task)
            if not writer.transport.is_closing():
                writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mode = self.mode
        if mode == "refuse":
            _reset(writer)
            return
        if mode == "blackhole":
            while await reader.read(65536):
                pass
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        try:
            upstream = asyncio.create_task(self._pump_up(reader, up_writer))
            try:
                if mode == "garble":
                    await self._garble(up_reader, writer, self.connections % 3)
                    return
                await self._pump_down(
                    up_reader, writer, reset_after=self.reset_after if mode == "reset" else None
                )
            finally:
                upstream.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await upstream
        finally:
            up_writer.transport.abort()

    async def _garble(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, kind: int) -> None:
        """``garble``'s answers: 0, the backend's own, a byte at a time (each answer, until
        the backend closes); 1, a malformed chunk, then a reset; 2, no HTTP, then a close."""
        if kind == 1:
            writer.write(_MALFORMED_CHUNK)
            await writer.drain()
            _reset(writer)
            return
        if kind == 2:
            writer.write(_NOT_HTTP)
            await writer.drain()
            writer.close()
            return
        while data := await reader.read(65536):
            for at in range(len(data)):
                writer.write(data[at : at + 1])
                await writer.drain()
        writer.close()

    async def _pump_up(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if self.latency:
                await asyncio.sleep(self.latency)
            writer.write(data)
            await writer.drain()
        writer.write_eof()

    async def _pump_down(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reset_after: int | None
    ) -> None:
        sent = 0
        while data := await reader.read(65536):
            if reset_after is not None and sent + len(data) >= reset_after:
                writer.write(data[: max(0, reset_after - sent)])
                await writer.drain()
                _reset(writer)
                return
            sent += len(data)
            writer.write(data)
            await writer.drain()
        writer.close()
