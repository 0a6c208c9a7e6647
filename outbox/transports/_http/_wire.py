"""The HTTP transport's own HTTP/1.1 client, for the one request it makes: a POST of a body
already built, to a plain ``http://`` backend reached without a proxy.

Why not httpx there: httpx, httpcore, anyio and h11 together spend about 1 ms of the sidecar's
CPU per request, in steps of 200-900 µs between two awaits, which the sidecar's slices cannot
cut; a handler that wants the GIL meanwhile waits them out, and that was the p99 of a whole
invocation while the sidecar shipped (``tests/scripts/http_request_cost.py`` prints what a
request costs).  This client writes the request in one piece, parses the answer where asyncio
hands it over (``data_received``), and answers with what ``read_capped``'s ``httpx.Response``
offers (:class:`Answer`, which builds that response once more than its status and body is read),
so everything that reads answers is unchanged.  TLS and proxies stay with httpx.

What it does as httpcore does: connections kept alive and reused (up to the transport's
places), one dropped when the peer closed it while idle; an answer framed by
``Content-Length``, ``Transfer-Encoding: chunked`` or the end of the connection; 1xx answers
skipped; a gzip or deflate answer decoded; the connect timeout, and the read timeout counted
from the last bytes that came.  Its failures are httpx's exceptions (``ConnectError``,
``ConnectTimeout``, ``ReadTimeout``, ``RemoteProtocolError``, ``ReadError``,
``DecodingError``), so the transport's outcomes are the same.  Like ``read_capped``, at most
``MAX_ANSWER_BYTES`` of an answer is read; a longer one is cut there and its connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import zlib
from collections.abc import Mapping

import httpx

__all__ = ["MAX_ANSWER_BYTES", "Answer", "WireClient"]

#: The most of an answer's body the transport reads (the rest is never read).
MAX_ANSWER_BYTES = 1024 * 1024
#: An answer's status line and headers longer than this: not an HTTP server.
MAX_HEAD = 64 * 1024
_FRAMING = ("content-encoding", "content-length", "transfer-encoding")
_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_READ_SIZE = 64 * 1024
_JOIN_BELOW = 64 * 1024  # a smaller body leaves in one write with its head (one segment)
_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110's token
_NOT_IN_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # control characters but the tab
_HEAD_END = re.compile(rb"\n\r?\n")  # lines end in CRLF, or a bare LF (as h11 accepts)


class WireClient:
    """POSTs to one ``http://`` origin over kept-alive connections.

    Args:
        origin: the ``http://host:port`` the URLs it is given share.
        headers: every request's headers (besides Host, Content-Length and per-request ones).
        connect_timeout, read_timeout: seconds, as httpx's.
        max_connections: connections kept open (the transport's places bound those in use).
        send_buffer: the socket's send buffer (``SO_SNDBUF``), or 0 for the system's.
    """

    def __init__(
        self,
        origin: httpx.URL,
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
        max_connections: int,
        send_buffer: int = 0,
    ) -> None:
        self._host = origin.raw_host.decode("ascii")
        self._port = origin.port or 80
        # Encoded as httpx would (ASCII, the names as given), once.
        fixed = [(b"Host", origin.netloc), (b"Accept", b"*/*"), (b"Connection", b"keep-alive")]
        self._fixed = fixed + httpx.Headers(dict(headers)).raw
        self._head = _lines(self._fixed)
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self._max_idle = max_connections
        self._send_buffer = send_buffer
        self._targets: dict[str, bytes] = {}
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    async def post(self, url: str, body: bytes, headers: Mapping[str, str] | None = None) -> Answer:
        """POST ``body`` to ``url`` (of this client's origin); the answer, its body read
        (at most ``MAX_ANSWER_BYTES`` of it) and decoded."""
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = httpx.URL(url).raw_path
        fields = self._head
        if headers:  # (a token provider's Authorization) in place of the same names' fixed ones
            extra = httpx.Headers(headers).raw
            names = {name.lower() for name, _ in extra}
            fields = _lines([pair for pair in self._fixed if pair[0].lower() not in names] + extra)
        head = b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n" % (target, fields, len(body))
        connection = await self._connection()
        try:
            answer = await connection.exchange(head, body, self._read_timeout)
        except BaseException:
            self._discard(connection)
            raise
        if connection.reusable and len(self._idle) < self._max_idle:
            self._idle.append(connection)
        else:
            self._discard(connection)
        return answer

    async def aclose(self) -> None:
        for connection in list(self._open):
            self._discard(connection)

    async def _connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        while self._idle:
            connection = self._idle.pop()
            # Not closed by the peer while idle, and of this loop (not a sidecar's before).
            if connection.reusable and connection.loop is loop:
                return connection
            self._discard(connection)
        connection = _Connection(loop)
        connect = loop.create_connection(lambda: connection, self._host, self._port)
        try:
            await asyncio.wait_for(connect, self._connect_timeout)
        except BaseException as exc:
            connection.close()  # (made just as a timeout or a cancel came: not left open)
            if isinstance(exc, TimeoutError):
                where, seconds = f"{self._host}:{self._port}", self._connect_timeout
                raise httpx.ConnectTimeout(f"no connection to {where} in {seconds:g} s") from None
            if isinstance(exc, OSError):
                raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
            raise
        if self._send_buffer:
            sock = connection.socket()
            if sock is not None:
                # EBADF: closed already, the peer having reset it as it was made (the loop saw
                # that first).  The exchange says so, as httpx says it.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
        self._open.add(connection)
        return connection

    def _discard(self, connection: _Connection) -> None:
        connection.close()
        self._open.discard(connection)


def _lines(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """The header lines of ``pairs``; :class:`httpx.LocalProtocolError` (as h11 raises it, but
    never quoting the value) for a name or a value a header cannot carry."""
    for name, value in pairs:
        if not _NAME.fullmatch(name) or _NOT_IN_VALUE.search(value):
            shown = name[:40]
            raise httpx.LocalProtocolError(f"the header {shown!r} cannot be sent (its value is not shown)")
    return b"".join(b"%s: %s\r\n" % pair for pair in pairs)


class _Connection(asyncio.BufferedProtocol):
    """One connection: a request written, its answer parsed as its bytes come (read into a
    buffer of its own: a plain Protocol's read allocates 256 KiB per read, for answers of a
    few dozen bytes)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._scratch = memoryview(bytearray(_READ_SIZE))
        self._waiter: asyncio.Future[Answer] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0  # loop time the answer's last bytes came
        self._writing = False  # a request's bytes wait in the transport (the peer reads slowly)
        self._reading = _Reading()  # how far the current answer has been read
        self._ended = False  # the peer closed (or the connection failed): never reused
        self.reusable = False

    def socket(self) -> socket.socket | None:
        return None if self._transport is None else self._transport.get_extra_info("socket")

    def close(self) -> None:
        """Closed at once, as httpx closes a connection: what is left of a request unwritten
        (a server that stopped reading) is dropped, not written on after it was given up."""
        self.reusable = False
        self._cancel_timer()
        if self._transport is not None and not self.loop.is_closed():  # (else closed with it)
            self._transport.abort()

    async def exchange(self, head: bytes, body: bytes, read_timeout: float) -> Answer:
        transport = self._transport
        assert transport is not None
        assert self._waiter is None
        loop = asyncio.get_running_loop()
        if self._ended or transport.is_closing():
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        self.reusable = False
        self._reading = _Reading()
        self._waiter = waiter = loop.create_future()
        if len(body) < _JOIN_BELOW:
            transport.write(head + body)
        else:
            transport.write(head)
            transport.write(body)
        self._last = loop.time()
        self._timer = loop.call_at(self._last + read_timeout, self._check_timeout, read_timeout)
        try:
            answer: Answer = await waiter
            return answer
        finally:
            self._waiter = None
            self._cancel_timer()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        # Paused above 64 KiB unwritten, resumed only once all is written (the read begins).
        transport.set_write_buffer_limits(high=64 * 1024, low=0)

    def pause_writing(self) -> None:
        self._writing = True

    def resume_writing(self) -> None:
        self._writing = False
        self._last = self.loop.time()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            # Bytes nobody asked for (an answer before the request, or after its own end):
            # this connection's framing can no longer be trusted.
            self._end()
            return
        self._buffer += self._scratch[:nbytes]
        self._last = waiter.get_loop().time()
        self._answer(eof=False)

    def eof_received(self) -> bool:
        if self._waiter is not None and not self._waiter.done():
            self._answer(eof=True)
        self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended = True
        self.reusable = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if exc is None:
                self._answer(eof=True)
            else:
                waiter.set_exception(httpx.ReadError(str(exc) or type(exc).__name__))
        self._cancel_timer()

    # -- the answer ------------------------------------------------------------------------

    def _answer(self, eof: bool) -> None:
        """Complete the waiter if the buffer holds a whole answer (or a failure is sure)."""
        assert self._waiter is not None
        try:
            answer = _parse(self._buffer, eof, self._reading)
        except httpx.HTTPError as exc:
            self._waiter.set_exception(exc)
            self._end()
            return
        if answer is None:
            return
        response, used, keep = answer
        # Reused only if its answer ended exactly where the bytes did, and the peer keeps it.
        self.reusable = keep and used == len(self._buffer) and not self._ended
        self._buffer.clear()
        self._waiter.set_result(response)

    def _check_timeout(self, read_timeout: float) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        loop = waiter.get_loop()
        if self._writing:  # as httpx's, the read timeout starts once the request is written
            self._last = loop.time()
        due = self._last + read_timeout
        if loop.time() < due:  # bytes came meanwhile: the timeout counts from them
            self._timer = loop.call_at(due, self._check_timeout, read_timeout)
            return
        waiter.set_exception(httpx.ReadTimeout(f"no answer within {read_timeout:g} s"))
        self._end()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _end(self) -> None:
        self._ended = True
        self.reusable = False
        if self._transport is not None:
            self._transport.abort()


class _Reading:
    """How far an answer has been read: its head once whole, and the chunks of a chunked body
    read so far; each byte is parsed once, whatever pieces the answer comes in (parsing it
    all again as each piece came was quadratic: a hostile server's 1-byte chunks stalled the
    sidecar for most of a second)."""

    __slots__ = ("chunk_at", "chunks", "chunks_size", "head", "start")

    def __init__(self) -> None:
        self.head: tuple[str, int, list[tuple[str, str]], dict[str, str]] | None = None
        self.start = 0  # where the body begins, once the head is read
        self.chunk_at = -1  # where the next chunk's size line begins (-1: not yet in a body)
        self.chunks: list[bytes] = []
        self.chunks_size = 0


def _parse(buffer: bytearray, eof: bool, reading: _Reading) -> tuple[Answer, int, bool] | None:
    """The answer at the start of ``buffer``, the bytes it used, and whether the connection
    may carry another request; None if more bytes are needed (``reading`` keeps what was
    read of it: the same one is passed again with the buffer grown)."""
    while reading.head is None:  # 1xx answers (100 Continue, 103 Early Hints) come first
        end = _HEAD_END.search(buffer)
        if end is None:
            if len(buffer) > MAX_HEAD:
                raise httpx.RemoteProtocolError("the answer's headers are longer than 64 KiB")
            if eof:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            return None
        version, status, headers = _head(bytes(buffer[: end.start()]))
        if status == 101:
            raise httpx.RemoteProtocolError("the server switched protocols (101) for a POST")
        if status < 200:
            del buffer[: end.end()]  # an informational answer, read: gone (each read once)
            continue
        fields: dict[str, str] = {}  # repeated ones joined (two Content-Lengths must agree)
        for name, value in headers:
            lower = name.lower()
            fields[lower] = f"{fields[lower]}, {value}" if lower in fields else value
        reading.head, reading.start = (version, status, headers, fields), end.end()
    version, status, headers, fields = reading.head
    keep = version == "HTTP/1.1" and "close" not in fields.get("connection", "").lower()
    framed = _body(buffer, reading, eof)
    if framed is None:
        return None
    content, used, whole = framed
    encoding = fields.get("content-encoding", "").strip().lower()
    if encoding in _DECODERS and content:
        content = _decoded(content, encoding)
    return Answer(status, headers, content), used, keep and whole


class Answer:
    """An answer this client read: ``status_code`` and ``content`` (all a delivered request
    needs) at once; ``headers``, ``reason_phrase`` and ``text`` from the ``httpx.Response``
    ``read_capped`` made of it, built the first time one is asked for.  Building it for every
    answer cost the sidecar's thread about 90 µs (its code cold), a handler's wait."""

    __slots__ = ("_fields", "_response", "content", "status_code")

    def __init__(self, status_code: int, fields: list[tuple[str, str]], content: bytes) -> None:
        self.status_code, self.content = status_code, content
        self._fields = fields
        self._response: httpx.Response | None = None

    def response(self) -> httpx.Response:
        """As read_capped made it from httpx's: framing headers dropped (the body is decoded
        and maybe cut), repeated ones joined, the standard reason phrase."""
        if self._response is None:
            kept: dict[str, tuple[str, str]] = {}
            for name, value in self._fields:
                lower = name.lower()
                if lower in _FRAMING:
                    continue
                if lower in kept:
                    first, joined = kept[lower]
                    kept[lower] = (first, f"{joined}, {value}")
                else:
                    kept[lower] = (name, value)
            # As bytes, as httpx keeps them (a value that is not ASCII is decoded when read).
            raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in kept.values()]
            self._response = httpx.Response(self.status_code, headers=raw, content=self.content)
        return self._response

    @property
    def headers(self) -> httpx.Headers:
        return self.response().headers

    @property
    def reason_phrase(self) -> str:
        return self.response().reason_phrase

    @property
    def text(self) -> str:
        return self.response().text


def _head(head: bytes) -> tuple[str, int, list[tuple[str, str]]]:
    """The version, status and headers of an answer's head (its reason phrase is not kept:
    the transport names the status by its standard phrase, as it did through httpx)."""
    lines = [line.removesuffix("\r") for line in head.decode("latin-1").split("\n")]
    version, _, rest = lines[0].partition(" ")
    code = rest.partition(" ")[0]
    if not version.startswith("HTTP/1.") or len(code) != 3 or not (code.isascii() and code.isdigit()):
        raise httpx.RemoteProtocolError(f"not an HTTP/1 answer: {lines[0][:80]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):  # obs-fold: the line goes on the header before, as h11 reads it
            if not headers:
                raise httpx.RemoteProtocolError("a continuation line at the start of the answer's headers")
            name, value = headers[-1]
            headers[-1] = (name, f"{value} {line.strip()}".strip())
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise httpx.RemoteProtocolError(f"a malformed header line in the answer: {line[:80]!r}")
        headers.append((name, value.strip()))
    return version, int(code), headers


def _body(buffer: bytearray, reading: _Reading, eof: bool) -> tuple[bytes, int, bool] | None:
    """The body after the head ``reading`` holds, the bytes used up to its end, and whether it
    ended where its framing said (False: cut at ``MAX_ANSWER_BYTES``, or by the connection's
    end)."""
    assert reading.head is not None
    _, status, _, fields = reading.head
    start = reading.start
    if status in (204, 304):
        return b"", start, True
    if "chunked" in fields.get("transfer-encoding", "").lower():
        if reading.chunk_at < 0:
            reading.chunk_at = start
        return _chunked(buffer, reading, eof)
    length_text = fields.get("content-length")
    if length_text is not None:
        lengths = {each.strip() for each in length_text.split(",")}  # "2, 2" is 2, as for h11
        if len(lengths) != 1:
            raise httpx.RemoteProtocolError("conflicting Content-Length headers in the answer")
        (length_text,) = lengths
        if not (length_text.isascii() and length_text.isdigit()):  # (int() refuses "²")
            raise httpx.RemoteProtocolError(f"a Content-Length that is not a number: {length_text[:40]!r}")
        length = int(length_text)
        have = len(buffer) - start
        if have >= length:
            return bytes(buffer[start : start + length]), start + length, True
        if have >= MAX_ANSWER_BYTES:
            return bytes(buffer[start : start + MAX_ANSWER_BYTES]), len(buffer), False
        if eof:
            raise httpx.RemoteProtocolError("the server closed the connection in the middle of its answer")
        return None
    # Neither: the body runs to the connection's end.
    if eof or len(buffer) - start >= MAX_ANSWER_BYTES:
        return bytes(buffer[start : start + MAX_ANSWER_BYTES]), len(buffer), False
    return None


def _chunked(buffer: bytearray, reading: _Reading, eof: bool) -> tuple[bytes, int, bool] | None:
    """A chunked body, read on from where ``reading`` left it."""
    chunks, at, size = reading.chunks, reading.chunk_at, reading.chunks_size
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            if len(buffer) - at > 1024:
                raise httpx.RemoteProtocolError("a malformed chunk in the answer")
            break
        try:
            length = int(bytes(buffer[at:line_end]).split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise httpx.RemoteProtocolError("a malformed chunk size in the answer") from None
        if length < 0:
            raise httpx.RemoteProtocolError("a malformed chunk size in the answer")
        if length == 0:  # the last chunk, then trailers up to an empty line
            trailers = line_end + 2
            if buffer[trailers : trailers + 2] == b"\r\n":
                return b"".join(chunks), trailers + 2, True
            end = buffer.find(b"\r\n\r\n", trailers)
            if end < 0:
                break
            return b"".join(chunks), end + 4, True
        data = line_end + 2
        available = min(length, len(buffer) - data)
        if size + available >= MAX_ANSWER_BYTES:
            chunks.append(bytes(buffer[data : data + available]))
            return b"".join(chunks)[:MAX_ANSWER_BYTES], len(buffer), False
        if len(buffer) < data + length + 2:
            break
        if buffer[data + length : data + length + 2] != b"\r\n":
            raise httpx.RemoteProtocolError("a chunk of the answer is longer than its size says")
        chunks.append(bytes(buffer[data : data + length]))
        size += length
        at = data + length + 2
    reading.chunk_at, reading.chunks_size = at, size
    if eof:
        raise httpx.RemoteProtocolError("the server closed the connection in the middle of its answer")
    return None


def _decoded(content: bytes, encoding: str) -> bytes:
    """``content`` decompressed, at most ``MAX_ANSWER_BYTES`` of it (a small answer can
    inflate to gigabytes)."""
    decoder = zlib.decompressobj(_DECODERS[encoding])
    try:
        return decoder.decompress(content, MAX_ANSWER_BYTES)
    except zlib.error:
        if encoding == "deflate":  # some servers send raw deflate, as httpx also accepts
            try:
                return zlib.decompressobj(-zlib.MAX_WBITS).decompress(content, MAX_ANSWER_BYTES)
            except zlib.error:
                pass
        raise httpx.DecodingError(f"the answer's {encoding} body could not be decoded") from None
