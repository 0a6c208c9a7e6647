"""A lineage backend that does no work: ``python -m outbox.tools.benchmarks.nullserver``.

It reads each HTTP/1.1 request (headers and body) and answers ``200`` at once, without
parsing the body, so what a client achieves against it is the client's own cost.  It
counts requests and bytes (``GET /count`` answers ``{"requests": N, "bytes": N}``).
Prints ``listening on http://HOST:PORT`` when ready.

With ``--keep`` it also keeps each body, as received, with the time it arrived and the
client's bearer token (``Authorization: Bearer WHO``), so that a benchmark can tell afterwards
which events arrived, how often and from whom: ``GET /count`` then adds ``events`` (counted
as the occurrences of ``"eventTime"`` in the bodies: a byte count, not a parse), ``by`` (the
same, by bearer token), ``first`` and ``last`` (``time.monotonic()`` of the first and last
body), and ``GET /bodies`` answers
one line per body, ``TIME<tab>WHO<tab>BODY`` (the bodies are JSON of one line).  After
``GET /hold/WHO`` (or ``GET /hold/WHO/N``: once WHO's earlier requests carried ``N`` events,
decided here as each request comes, so that no request slips by between a look and the hold),
requests from WHO are read, counted and kept as usual, but never answered (``held`` in ``GET
/count`` counts them): a backend that took the events and whose answer never came back, as a
client killed while it waits sees it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

_OK = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"


async def _serve(host: str, port: int, keep: bool) -> None:
    counts: dict[str, Any] = {"requests": 0, "bytes": 0}
    if keep:
        counts.update(events=0, first=0.0, last=0.0, by={}, held=0)
    kept: list[bytes] = []
    hold: dict[bytes, int] = {}  # who: the events delivered after which their requests are held

    def answer(writer: asyncio.StreamWriter, body: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                who = b"-"
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                    elif keep and line[:21].lower() == b"authorization: bearer":
                        who = line[21:].strip()
                body = await reader.readexactly(length) if length else b""
                if head.startswith(b"GET /count"):
                    answer(writer, json.dumps(counts).encode())
                elif head.startswith(b"GET /bodies"):
                    answer(writer, b"".join(kept))
                elif head.startswith(b"GET /hold/"):
                    target, _, after = head.split(b" ", 2)[1].removeprefix(b"/hold/").partition(b"/")
                    hold[target] = int(after or 0)
                    answer(writer, b"")
                else:
                    counts["requests"] += 1
                    counts["bytes"] += length
                    if keep:
                        now = time.monotonic()
                        events = body.count(b'"eventTime"')
                        counts["events"] += events
                        before = counts["by"].get(who.decode(), 0)
                        counts["by"][who.decode()] = before + events
                        counts["first"] = counts["first"] or now
                        counts["last"] = now
                        kept.append(b"%r\t%s\t%s\n" % (now, who, body))
                        if who in hold and before >= hold[who]:
                            counts["held"] += 1
                            await asyncio.Event().wait()  # taken, never answered
                    writer.write(_OK)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    bound = server.sockets[0].getsockname()
    print(f"listening on http://{bound[0]}:{bound[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument(
        "--keep", action="store_true", help="keep each body, its time and its bearer token (GET /bodies)"
    )
    args = parser.parse_args()
    asyncio.run(_serve(args.host, args.port, args.keep))


if __name__ == "__main__":
    main()
