"""An OpenLineage HTTP backend for tests that counts what a client does to it at once: the
requests it is answering and the connections open, with their peaks.  Each request is answered
200 after a delay drawn (seeded) from ``delay``; every body is kept.  It runs an asyncio server on
a thread of its own, with HTTP/1.1 keep-alive, so that a pool of connections is seen as it is."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

__all__ = ["CountingServer"]


class CountingServer:
    """Use as a context manager; ``url`` is its base URL.

    Args:
        delay: (lowest, highest) seconds before each answer, uniform.
        seed: for the delays.
    """

    def __init__(self, delay: tuple[float, float] = (0.0, 0.0), seed: int = 0) -> None:
        self.delay = delay
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.requests = self.peak_requests = 0
        self.connections = self.peak_connections = 0
        self.bodies: list[bytes] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="counting-server", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def __enter__(self) -> CountingServer:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def received(self) -> int:
        with self.lock:
            return len(self.bodies)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._started.set()
        self._loop.run_forever()
        self._server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    def _count(self, what: str, step: int) -> None:
        with self.lock:
            now = getattr(self, what) + step
            setattr(self, what, now)
            peak = f"peak_{what}"
            setattr(self, peak, max(getattr(self, peak), now))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._count("connections", 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                self._count("requests", 1)
                try:
                    await asyncio.sleep(self.random.uniform(*self.delay))
                    with self.lock:
                        self.bodies.append(body)
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                finally:
                    self._count("requests", -1)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._count("connections", -1)
            writer.close()
