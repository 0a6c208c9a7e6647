"""The HTTP transport's own HTTP/1.1 client (``_http/_wire.py``, plain ``http://`` without a
proxy), against a loopback server that answers scripted bytes.

It stands in for httpx on that path, so it is proven faithful to it: the same answers, good,
odd and hostile, are read through httpx (as the transport read them before) and through it,
and what comes out (status, reason, headers, body, or the kind of error) must be equal.  Then
what httpx gave for free: connections kept alive and reused, a connection the server closed
while idle, the read timeout counted from the last bytes, and the request's own bytes."""

from __future__ import annotations

import asyncio
import gzip
import socket
import struct
import threading
import time
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from outbox.transports import DELIVERED, HttpTransport, OutcomeKind, SerializedEvent
from outbox.transports._http._answers import MAX_ANSWER_BYTES, read_capped
from outbox.transports._http._wire import WireClient

from support import parts

CLOSE = b"<close>"  # in a script: the server closes the connection there


@dataclass
class Scripted:
    """Answers each request with the next script (a list of byte strings, sent with a short
    pause between them, and ``CLOSE``); records what it was sent."""

    scripts: list[list[bytes]]
    url: str = ""
    requests: list[tuple[bytes, bytes]] = field(default_factory=list)  # (head, body)
    connections: int = 0
    server: asyncio.Server | None = None
    handlers: list[asyncio.Task[None]] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                script = self.scripts.pop(0) if self.scripts else [CLOSE]
                for piece in script:
                    if piece == CLOSE:
                        writer.close()
                        return
                    writer.write(piece)
                    await writer.drain()
                    if len(script) > 2:
                        await asyncio.sleep(0.002)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@asynccontextmanager
async def scripted(*scripts: list[bytes]) -> AsyncIterator[Scripted]:
    server = Scripted(list(scripts))
    server.server = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = server.server.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}/api/v1/lineage"
    try:
        yield server
    finally:
        server.server.close()
        for task in server.handlers:
            task.cancel()
        await asyncio.gather(*server.handlers, return_exceptions=True)


def wire(url: str, read_timeout: float = 5.0, headers: dict[str, str] | None = None) -> WireClient:
    origin = httpx.URL(url).copy_with(path="/", query=None)
    return WireClient(origin, headers or {"Content-Type": "application/json"}, 5.0, read_timeout, 2)


async def through_httpx(url: str, body: bytes) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5.0) as client, client.stream("POST", url, content=body) as response:
        return await read_capped(response)


async def through_wire(url: str, body: bytes) -> httpx.Response:
    client = wire(url)
    try:
        return await client.post(url, body)
    finally:
        await client.aclose()


def seen(answer: httpx.Response | BaseException) -> object:
    if isinstance(answer, BaseException):
        return type(answer).__name__
    headers = sorted((k.lower(), v) for k, v in answer.headers.multi_items())
    return answer.status_code, answer.reason_phrase, headers, answer.content


def chunked(data: bytes, size: int) -> bytes:
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


BIG = bytes(range(256)) * (3 * 1024 * 1024 // 256)
BOMB = gzip.compress(b"\0" * (20 * 1024 * 1024))
ANSWERS: dict[str, list[bytes]] = {
    "length": [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"],
    "in many pieces": [b"HTTP/1.1 2", b"00 OK\r\nContent-Le", b"ngth: 5\r\n\r", b"\nhel", b"lo"],
    "chunked": [
        b"HTTP/1.1 207 Multi-Status\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"5\r\nhello\r\n6;ext=1\r\n",
        b" world\r\n0\r\nX-Trailer: 1\r\n\r\n",
    ],
    "100 continue first": [
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"
    ],
    "no reason phrase": [b"HTTP/1.1 429 \r\nRetry-After: 3\r\nContent-Length: 0\r\n\r\n"],
    "204": [b"HTTP/1.1 204 No Content\r\nX-Request-Id: 7\r\n\r\n"],
    "to the end of the connection": [b"HTTP/1.1 400 Bad Request\r\n\r\nbad event", CLOSE],
    "HTTP/1.0": [
        b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\ndown",
        CLOSE,
    ],
    "repeated headers": [
        b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 0\r\n\r\n"
    ],
    "gzip": [
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
        % (len(gzip.compress(b'{"x": 1}')), gzip.compress(b'{"x": 1}'))
    ],
    "deflate": [
        b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n%s"
        % (len(zlib.compress(b"deflated")), zlib.compress(b"deflated"))
    ],
    "a gzip bomb": [
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(BOMB), BOMB)
    ],
    "longer than the cap": [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BIG), BIG)],
    "chunked, longer than the cap": [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(BIG, 65536)
    ],
    "cut in the middle": [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b", CLOSE],
    "cut in a chunk": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc", CLOSE],
    "no answer at all": [CLOSE],
    "not HTTP": [b"SSH-2.0-OpenSSH_9.6\r\n\r\n"],
    "a folded header (obs-fold)": [
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\n  2\r\n\tthree \r\nContent-Length: 2\r\n\r\nok"
    ],
    "a folded first header": [b"HTTP/1.1 200 OK\r\n X-A: 1\r\nContent-Length: 2\r\n\r\nok"],
    "a UTF-8 header value": ["HTTP/1.1 200 OK\r\nX-Message: café\r\nContent-Length: 0\r\n\r\n".encode()],
    "a Latin-1 header value": [
        b"HTTP/1.1 429 \r\nX-Message: caf\xe9\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"
    ],
    "a status of digits that are not ASCII": [b"HTTP/1.1 2\xb20 OK\r\nContent-Length: 2\r\n\r\nok"],
    "a Content-Length of digits that are not ASCII": [b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\nok"],
    "a Content-Length list of one length": [b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok"],
    "conflicting Content-Lengths": [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 2\r\n\r\nok",
        CLOSE,
    ],
    "bare LF line ends": [b"HTTP/1.1 200 OK\nX-A: 1\r\nContent-Length: 2\n\r\nok"],
    "bare LF, 100 continue first": [b"HTTP/1.1 100 Continue\n\nHTTP/1.1 201 Created\nContent-Length: 0\n\n"],
    "a bad chunk size": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"],
}


@pytest.mark.parametrize("name", list(ANSWERS))
async def test_every_answer_reads_as_httpx_reads_it(name):
    body = b'[{"eventType": "START"}]'
    answers = []
    for post in (through_httpx, through_wire):
        async with scripted(ANSWERS[name]) as server:
            try:
                answers.append(seen(await post(server.url, body)))
            except httpx.HTTPError as exc:
                answers.append(seen(exc))
    assert answers[0] == answers[1]
    if name == "a UTF-8 header value":
        assert ("x-message", "café") in answers[1][2]  # type: ignore[index]
    if name.endswith("the cap") or name == "a gzip bomb":
        assert len(answers[1][3]) == MAX_ANSWER_BYTES  # type: ignore[index]


async def test_the_request_carries_what_httpx_sends_but_accept_encoding():
    headers = {"Content-Type": "application/json", "User-Agent": "lineage-outbox/x", "X-Api-Key": "k"}
    body = bytes(range(256)) * 4096  # 1 MiB, written in two pieces
    ok = [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]
    async with scripted(ok, ok) as server:
        async with httpx.AsyncClient(headers=headers) as client:
            await client.post(server.url + "?q=1", content=body)
        client = wire(server.url, headers=headers)
        await client.post(server.url + "?q=1", body)
        await client.aclose()
    (theirs, their_body), (ours, our_body) = server.requests

    def fields(head: bytes) -> tuple[bytes, set[bytes]]:
        line, *rest = head.rstrip(b"\r\n").split(b"\r\n")
        return line, {f.lower() for f in rest}

    assert our_body == their_body == body
    assert fields(ours)[0] == fields(theirs)[0] == b"POST /api/v1/lineage?q=1 HTTP/1.1"
    assert fields(theirs)[1] - fields(ours)[1] == {b"accept-encoding: gzip, deflate"}
    assert fields(ours)[1] - fields(theirs)[1] == set()


async def test_a_header_that_cannot_be_sent_is_refused_without_quoting_it():
    async with scripted() as server:
        with pytest.raises(httpx.LocalProtocolError) as caught:
            await wire(server.url).post(server.url, b"{}", {"Authorization": "Bearer s3cret\r\nX: 1"})
        assert "s3cret" not in str(caught.value)
        assert server.requests == []


async def test_connections_are_kept_alive_and_one_closed_by_either_side_is_not_reused():
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    async with scripted([ok], [ok], [closing], [ok], [ok, CLOSE], [ok]) as server:
        client = wire(server.url)
        for _ in range(3):
            assert (await client.post(server.url, b"{}")).status_code == 200
        assert server.connections == 1  # the first three on one connection; the third said close
        assert (await client.post(server.url, b"{}")).status_code == 200
        assert server.connections == 2
        assert (await client.post(server.url, b"{}")).status_code == 200  # then the server closes it
        await server.handlers[-1]  # the server closed it...
        await asyncio.sleep(0.05)  # ...and its end reached the client's loop as it idled
        assert (await client.post(server.url, b"{}")).status_code == 200  # a new one, no error
        assert server.connections == 3
        await client.aclose()


async def test_the_read_timeout_counts_from_the_last_bytes_that_came():
    """An answer that trickles in, 0.2 s between pieces, is read whole under a 0.3 s read
    timeout (httpx's: per read); a server that never answers times out after 0.3 s."""
    pieces = [b"HTTP/1.1 200 OK\r\n", b"Content-Length: 4\r\n\r\n", b"ab", b"c", b"d"]

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        for piece in pieces:
            await asyncio.sleep(0.2)
            writer.write(piece)

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        await asyncio.sleep(30)

    servers = [await asyncio.start_server(each, "127.0.0.1", 0) for each in (trickle, silent)]
    slow, quiet = (f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/x" for srv in servers)
    loop = asyncio.get_running_loop()
    try:
        began = loop.time()
        assert (await wire(slow, read_timeout=0.3).post(slow, b"{}")).content == b"abcd"
        assert loop.time() - began >= 1.0  # five pieces, 0.2 s apart: read to the end
        began = loop.time()
        with pytest.raises(httpx.ReadTimeout):
            await wire(quiet, read_timeout=0.3).post(quiet, b"{}")
        assert 0.3 <= loop.time() - began < 5
    finally:
        for srv in servers:
            srv.close()


async def test_a_refused_connection_is_a_connect_error():
    async with scripted() as server:
        url = server.url
    with pytest.raises(httpx.ConnectError):
        await wire(url).post(url, b"{}")


async def test_a_connection_reset_as_it_is_made_is_an_httpx_error_not_an_os_error():
    """A peer that resets every connection as it accepts it (``FaultProxy``'s ``refuse``), from
    another thread: the reset often reaches the loop before the connect's caller resumes, and
    the socket is closed under it.  Setting its send buffer then raised ``OSError(EBADF)``,
    which the transport took for a bug ("send raised"), in about half of the attempts.  Every
    failure is one of httpx's, as the transport's outcomes expect."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=512)

    def reset_each() -> None:
        while True:
            try:
                accepted, _ = listener.accept()
            except OSError:
                return  # closed: the test is over
            accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            accepted.close()

    threading.Thread(target=reset_each, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/x"
    client = WireClient(httpx.URL(url).copy_with(path="/"), {}, 5.0, 5.0, 2, send_buffer=65536)
    failures: list[type[BaseException]] = []
    try:
        for _ in range(300):
            try:
                await client.post(url, b"{}")
            except Exception as exc:  # (never an answer: every connection is reset)
                failures.append(type(exc))
    finally:
        listener.close()
        await client.aclose()
    assert len(failures) == 300, "a connection reset at once was answered"
    assert all(issubclass(kind, httpx.TransportError) for kind in failures), set(failures)


async def until(condition, seconds: float = 5.0) -> bool:
    """Whether ``condition()`` came true within ``seconds`` (checked as the loop turns)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not condition():
        if loop.time() > end:
            return False
        await asyncio.sleep(0.01)
    return True


@asynccontextmanager
async def never_reading() -> AsyncIterator[str]:
    """A server that accepts and never reads (a backend stuck; its receive window shut)."""
    held: list[asyncio.StreamWriter] = []

    async def stuck(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(stuck, "127.0.0.1", 0)
    server.sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/x"
    finally:
        server.close()
        for writer in held:
            writer.close()


async def test_a_request_given_up_while_its_body_is_written_closes_its_connection():
    """Cut off (the transport's deadline) while the server does not read its body: the
    connection is closed at once, as httpx closes it, not left open until its 8 MiB are
    written (never, to a stuck server: a socket and the body held per attempt)."""
    async with never_reading() as url:
        client = WireClient(httpx.URL(url).copy_with(path="/"), {}, 5.0, 5.0, 2, send_buffer=65536)
        posting = asyncio.ensure_future(asyncio.wait_for(client.post(url, b"x" * (8 * 1024 * 1024)), 0.3))
        assert await until(lambda: bool(parts.wire_connections(client)))
        (connection,) = parts.wire_connections(client)
        sock = connection.socket()
        assert sock is not None
        with pytest.raises(TimeoutError):
            await posting
        assert parts.wire_connections(client) == set()
        assert await until(lambda: sock.fileno() == -1)


async def test_the_read_timeout_starts_once_the_request_is_written():
    """A server that takes its 4 MiB body slowly (64 KiB per 10 ms, over half a second) and
    then answers: read whole under a 0.2 s read timeout, as httpx reads it (its read timeout
    starts once the request is written; the writing is bounded by the transport's timeout)."""
    body = b"x" * (4 * 1024 * 1024)

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        left = len(body)
        while left:
            left -= len(await reader.read(min(left, 65536)))
            await asyncio.sleep(0.01)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    server = await asyncio.start_server(slow, "127.0.0.1", 0)
    server.sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/x"
    loop = asyncio.get_running_loop()
    try:
        client = WireClient(httpx.URL(url).copy_with(path="/"), {}, 5.0, 0.2, 2, send_buffer=65536)
        began = loop.time()
        assert (await client.post(url, body)).content == b"ok"
        assert loop.time() - began > 0.4  # (the body did take longer than the read timeout)
        await client.aclose()
    finally:
        server.close()


def test_an_answer_in_many_pieces_is_parsed_once_not_again_with_each_piece():
    """Each piece of an answer is parsed as it comes, from where the last one stopped: a
    chunked answer of 20,000 one-byte chunks, arriving in 2,000 pieces, costs about what it
    costs arriving whole (parsing it all again with each piece was quadratic: a hostile server
    stalled the sidecar, GIL held, for most of a second).  A ratio in one run, generous."""
    import time

    from outbox.transports._http._wire import _parse, _Reading

    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1\r\nx\r\n" * 20_000 + b"0\r\n\r\n"

    def cost(pieces: int) -> float:
        buffer, reading, step = bytearray(), _Reading(), -(-len(answer) // pieces)
        began = time.thread_time()
        for at in range(0, len(answer), step):
            buffer += answer[at : at + step]
            parsed = _parse(buffer, False, reading)
        elapsed = time.thread_time() - began
        assert parsed is not None
        assert parsed[0].content == b"x" * 20_000
        return elapsed

    whole = min(cost(1) for _ in range(3))
    assert min(cost(2_000) for _ in range(3)) < 10 * whole + 0.05


async def test_a_delivered_batch_builds_no_httpx_response(monkeypatch):
    """An answer's status and body are read at once; httpx's Response (about 90 µs of the
    sidecar's thread per request, cold) is built only when its headers, reason or text are
    asked for: on a refusal, never for a delivered batch."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"
    refused = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nbusy"
    built = []
    make = httpx.Response.__init__

    def counted(self, *args, **kwargs):
        built.append(args[0] if args else kwargs.get("status_code"))
        make(self, *args, **kwargs)

    monkeypatch.setattr(httpx.Response, "__init__", counted)
    async with scripted([ok], [refused]) as server:
        transport = HttpTransport(server.url, mode="batch")
        events = [SerializedEvent(b'{"eventType":"START"}', "run-1", None)]
        try:
            assert await transport.send(events, time.monotonic() + 5) == [DELIVERED]
            assert built == []
            (outcome,) = await transport.send(events, time.monotonic() + 5)
        finally:
            await transport.aclose()
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.retry_after == 7  # the headers, read through httpx's Response
    assert "503 Service Unavailable" in outcome.detail
    assert built == [503]
