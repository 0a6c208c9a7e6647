"""A lineage backend that does no work: ``python -m outbox.tools.benchmarks.nullserver``.

It reads each HTTP/1.1 request (headers and body) and answers ``200`` at once, without
parsing the body, so what a client achieves against it is the client's own cost.  It
counts requests and bytes (``GET /count`` answers ``{"requests": N, "bytes": N}``).
Prints ``listening on http://HOST:PORT`` when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json

_OK = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"


async def _serve(host: str, port: int) -> None:
    counts = {"requests": 0, "bytes": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                if head.startswith(b"GET /count"):
                    body = json.dumps(counts).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                else:
                    counts["requests"] += 1
                    counts["bytes"] += length
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
    args = parser.parse_args()
    asyncio.run(_serve(args.host, args.port))


if __name__ == "__main__":
    main()
