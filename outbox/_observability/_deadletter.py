"""The dead-letter file: every event the outbox settles as undeliverable for good (rejected,
poison, too large, invalid) is appended to a JSON-lines file with its reason, the backend's
answer and the time, so that nothing leaves without a trace.  ``outbox replay FILE`` sends such a
file again.

One line per event, a JSON object that ends with its frame, the CRC-32 of every byte before it::

    {"time":"2026-12-02T10:00:00.123456+00:00","reason":"poison",
     "answer":"POST http://marquez:5000/api/v1/lineage answered 500 ...","event":{...},"crc32":"1c291ca3"}

``event`` is the event whole, byte for byte as it was (or would have been) sent: a pre-serialized
event's own text (its whitespace, its numbers as written), the outbox's JSON for an object.  A
pre-serialized event whose text spans lines (a JSON lines file holds no raw newline), or is not a
JSON object, keeps its text whole in ``event_text``, a JSON string: replay sends that text,
unchanged, when it is a JSON object.  An object that could not be serialized at all has its
``repr`` in ``event_repr`` (cut to 1 MiB).  Text that is not a JSON object, and a ``repr``,
cannot be replayed.

The frame: a newline ends each record, and the CRC-32 covers everything before ``,"crc32"``, so a
record cut short (a SIGKILL, a full disk) or altered fails its check.  A length would add nothing
the newline does not give.  The file stays JSON lines for people and ``jq``.

What holds:

* A torn record is detected and skipped by the reader (one warning); a writer that finds the
  file ending without a newline starts a new line first, so the next record is never glued to
  it.  A write that fails part-way (a full disk, ``RLIMIT_FSIZE``) is cut back to its last whole
  record.  Writers in several threads or processes take an ``flock`` on the file for each write.
* Size: when a write would take the file past ``max_bytes`` it is rotated, renamed ``FILE.1``
  (with replay's record of what it delivered, ``FILE.replayed``), and a new file begun.
  ``FILE.1`` is never overwritten or deleted: while it exists and ``FILE`` is full, further
  records are not written, counted as ``dead_letter_full`` and logged.  The files take at most
  2 x ``max_bytes`` on disk.  Replay ``FILE.1``, then remove it, to make room.
* Not synced to disk: a crash of the process loses nothing written; a crash of the machine may
  lose the last records (the page cache), and leaves at worst a torn tail.
* Records the file could not take are counted (``stats()``) and logged at a bounded rate; the
  events themselves are counted by the outbox under their own reasons either way.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import tempfile
import threading
import weakref
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

import orjson

from .._errors import ConfigError
from ._log import RateLimitedLog

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DeadLetter",
    "Entry",
    "Torn",
    "frame",
    "progress_path",
    "rotated_path",
    "scan",
]

#: Default cap of one dead-letter file (the rotated one takes as much again).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
_REPR_LIMIT = 1024 * 1024
# ,"crc32":"0123abcd"}
_TRAILER_HEAD = b',"crc32":"'
_TRAILER_LEN = len(_TRAILER_HEAD) + 8 + 2
# Every record begins so (orjson keeps the keys in the order given).
_START = b'{"time":"'
_EVENT_KEY = b',"event":'
_TEXT_KEY = b',"event_text":'
# Not written, by why.
FULL = "dead_letter_full"
ERROR = "dead_letter_error"


def rotated_path(path: str) -> str:
    """Where a full dead-letter file goes."""
    return path + ".1"


def progress_path(path: str) -> str:
    """Where ``outbox replay`` records what it delivered from ``path``."""
    return path + ".replayed"


def frame(record: bytes) -> bytes:
    """``record`` (a JSON object without its closing brace) framed: its CRC-32 and a newline."""
    return record + b',"crc32":"%08x"}\n' % zlib.crc32(record)


def _unframed(line: bytes) -> bytes | None:
    """The bytes the frame of ``line`` (no newline) covers, or None if it has no valid frame."""
    if len(line) < _TRAILER_LEN or not line.endswith(b'"}'):
        return None
    cut = len(line) - _TRAILER_LEN
    if line[cut : cut + len(_TRAILER_HEAD)] != _TRAILER_HEAD:
        return None
    try:
        crc = int(line[cut + len(_TRAILER_HEAD) : -2], 16)
    except ValueError:
        return None
    body = line[:cut]
    return body if zlib.crc32(body) == crc else None


def _sent(body: bytes) -> bytes:
    """The event part of a record for ``body``, a JSON object as it was (or would have been)
    sent, kept byte for byte: as it is, in ``event``, when it sits on one line; else (a
    pre-serialized event over several lines) as a JSON string, in ``event_text``."""
    if b"\n" in body or b"\r" in body:
        return _TEXT_KEY + orjson.dumps(body.decode())
    return _EVENT_KEY + body


def _unsent(event: Any) -> bytes:
    """The ``event`` part of a record for an event the outbox never serialized."""
    if isinstance(event, (str, bytes, bytearray, memoryview)):
        if not isinstance(event, str):
            raw = bytes(event)
        else:
            try:  # the bytes the outbox would have sent
                raw = event.encode()
            except UnicodeEncodeError:  # a lone surrogate: no JSON, and never sent
                raw = event.encode("utf-8", "surrogatepass")
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return _sent(raw)
        text = raw.decode("utf-8", "backslashreplace")
        return _TEXT_KEY + orjson.dumps(text)
    try:
        text = repr(event)[:_REPR_LIMIT]
    except Exception as exc:  # a repr that raises: say what it was
        text = f"<{type(event).__qualname__} whose repr raised {exc!r}>"
    return b',"event_repr":' + orjson.dumps(text)


def _record(now: str, reason: str, answer: str, body: bytes | None, event: Any) -> bytes:
    head = orjson.dumps({"time": now, "reason": str(reason), "answer": str(answer)})[:-1]
    part = _sent(body) if body is not None else _unsent(event)
    return frame(head + part)


class DeadLetter:
    """Appends settled-for-good events to ``path`` (opened per write: rotation-friendly).

    Raises:
        ConfigError: ``path`` is a directory, its folder does not exist, or it cannot be
            written (a read-only filesystem, no permission); the message names the path.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        log_interval: float = 30.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self._log = RateLimitedLog(log_interval)
        self._lock = threading.Lock()
        self._written = 0
        self._lost: dict[str, int] = {}
        _check_writable(self.path)
        _instances.add(self)

    def stats(self) -> dict[str, Any]:
        """Records written, and records not written by why (``dead_letter_full``,
        ``dead_letter_error``)."""
        with self._lock:
            return {"written": self._written, "not_written": dict(self._lost)}

    def counts(self) -> dict[str, int]:
        """``written``, and the records not written by why (for ``Outbox.stats()``)."""
        with self._lock:
            return {"written": self._written, **self._lost}

    def write(self, records: Iterable[tuple[str, str, bytes | None, Any]]) -> None:
        """``records``: (reason, the backend's answer or why, the event's JSON as the outbox
        serialized it or None, the event as emitted).  Never raises: what the file cannot
        take is counted and logged (at a bounded rate); the events stay counted."""
        now = datetime.now(UTC).isoformat()
        lines = []
        for reason, answer, body, event in records:
            try:
                lines.append(_record(now, reason, answer, body, event))
            except Exception as exc:  # never let a dead letter break the worker
                self._count(ERROR, 1)
                self._log.error("dead-letter-record", "cannot make a dead-letter record: %r", exc)
        if not lines:
            return
        written, full, failed = self._append(lines)
        with self._lock:
            self._written += written
        if failed:
            self._count(ERROR, failed)
        if full:
            self._count(FULL, full)
            self._log.error(
                "dead-letter-full",
                "the dead-letter file %s is full (dead_letter_max_bytes=%d, and %s not yet removed): "
                "%d record(s) not written, counted as %s; replay and remove %s to make room",
                self.path,
                self.max_bytes,
                rotated_path(self.path),
                full,
                FULL,
                rotated_path(self.path),
            )

    def _count(self, why: str, n: int) -> None:
        with self._lock:
            self._lost[why] = self._lost.get(why, 0) + n

    def _open_locked(self) -> int:
        """An fd on the file now at ``path``, flocked (another writer may rotate it while we
        wait for the lock: then open the new one)."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = os.fstat(fd)
                now = os.stat(self.path)
            except FileNotFoundError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                return fd
            os.close(fd)

    def _append(self, lines: list[bytes]) -> tuple[int, int, int]:
        """Write ``lines``, rotating at ``max_bytes``: (records written, records the files
        were too full for, records a write error lost)."""
        written = full = 0
        fd = None
        try:
            fd = self._open_locked()
            size = os.fstat(fd).st_size
            i = 0
            while i < len(lines):
                room = self.max_bytes - size - 1  # a newline may have to go first
                j = i
                while j < len(lines) and len(lines[j]) <= room:
                    room -= len(lines[j])
                    j += 1
                if j > i:
                    size, done = self._write_chunk(fd, size, lines[i:j])
                    written += done
                    if done < j - i:  # cut short (a full disk): the rest are not written
                        return written, full, len(lines) - written - full
                    i = j
                elif len(lines[i]) >= self.max_bytes:  # fits no file: count it, go on
                    full += 1
                    i += 1
                else:
                    rotated = self._rotate(size)
                    if rotated is None:
                        full += len(lines) - i
                        break
                    os.close(fd)
                    fd = rotated
                    size = os.fstat(fd).st_size
            return written, full, 0
        except OSError as exc:
            self._log.error(
                "dead-letter",
                "cannot write the dead-letter file %s: %s (%d record(s) not written, counted as %s)",
                self.path,
                exc,
                len(lines) - written - full,
                ERROR,
            )
            return written, full, len(lines) - written - full
        finally:
            if fd is not None:
                os.close(fd)  # releases the lock

    def _write_chunk(self, fd: int, size: int, chunk: list[bytes]) -> tuple[int, int]:
        """Append ``chunk`` at ``size``; (the new size, records written whole).  A write that
        fails part-way is cut back to its last whole record, and logged."""
        prefix = b""
        if size and os.pread(fd, 1, size - 1) != b"\n":
            prefix = b"\n"
            self._log.warning(
                "dead-letter-torn",
                "the dead-letter file %s ends in a torn record (a crash or a full disk mid-write): "
                "it is skipped when replayed, and the next record starts on a new line",
                self.path,
            )
        data = memoryview(prefix + b"".join(chunk))
        done = 0
        try:
            while done < len(data):
                done += os.write(fd, data[done:])
        except OSError as exc:
            whole, end = 0, len(prefix)
            for line in chunk:
                if end + len(line) > done:
                    break
                end += len(line)
                whole += 1
            keep = size + (end if whole else 0)
            try:
                os.ftruncate(fd, keep)
            except OSError:
                keep = size + done  # the torn tail stays; the next write starts a new line
            self._log.error(
                "dead-letter",
                "cannot write the dead-letter file %s: %s (%d of %d record(s) written; the rest "
                "counted as %s)",
                self.path,
                exc,
                whole,
                len(chunk),
                ERROR,
            )
            return keep, whole
        return size + done, len(chunk)

    def _rotate(self, size: int) -> int | None:
        """Rename the full file to FILE.1 (holding its lock) and open a new one; None when
        FILE.1 is still there (or the file is empty: rotating would gain nothing)."""
        rotated = rotated_path(self.path)
        if size == 0 or os.path.lexists(rotated):
            return None
        os.rename(self.path, rotated)
        progress = progress_path(self.path)
        if os.path.lexists(progress):
            # Should this fail, replay sends FILE.1's events again: at least once.
            with contextlib.suppress(OSError):
                os.rename(progress, progress_path(rotated))
        self._log.warning(
            "dead-letter-rotated",
            "the dead-letter file %s reached dead_letter_max_bytes (%d): renamed %s; replay it, "
            "then remove it",
            self.path,
            self.max_bytes,
            rotated,
        )
        return self._open_locked()

    def __repr__(self) -> str:
        return f"DeadLetter({self.path!r})"


# A fork child must not inherit a counters' lock that another thread of the parent held, nor
# the parent's counts.
_instances: weakref.WeakSet[DeadLetter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for dead_letter in list(_instances):
        dead_letter._lock = threading.Lock()
        # The child's outbox counts from zero (its stats() are its own), and so does its file.
        dead_letter._written = 0
        dead_letter._lost = {}


os.register_at_fork(after_in_child=_after_fork_in_child)


def _not_a_file(path: str) -> str | None:
    """What ``path`` is when it exists and is not a regular file (nor a directory)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def _check_writable(path: str) -> None:
    """A ConfigError now, rather than events lost later without a file to show for it."""
    where = f"dead_letter={path!r}"
    if not path:
        raise ConfigError("dead_letter='' is not a path; pass the path of a JSON-lines file")
    if os.path.isdir(path):
        raise ConfigError(
            f"{where} is a directory; name a file in it, such as "
            f"{os.path.join(path, 'dead-letters.jsonl')!r} (OUTBOX_DEAD_LETTER)"
        )
    kind = _not_a_file(path)
    if kind:
        # A FIFO would block the sidecar once its reader stops reading; /dev/null would keep
        # nothing while the outbox says the events are kept; neither can be rotated.
        raise ConfigError(
            f"{where} is {kind}, not a regular file: dead letters must be kept in a file that "
            "can be read back and rotated; name a file (OUTBOX_DEAD_LETTER)"
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(
            f"{where}: the folder {folder!r} does not exist; create it or choose another path "
            "(OUTBOX_DEAD_LETTER)"
        )
    try:
        # Rotation renames in the folder, so the folder must be writable, not only the file.
        probe, probe_path = tempfile.mkstemp(dir=folder, prefix=".outbox-dead-letter-probe-")
        os.close(probe)
        os.unlink(probe_path)
        if os.path.lexists(path):  # (non-blocking: should it be a FIFO by now, fail, not wait)
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK))
    except OSError as exc:
        raise ConfigError(
            f"{where} cannot be written ({exc.strerror or exc}); make {folder!r} writable by this "
            "process, or choose a path on a writable filesystem (dead_letter=, OUTBOX_DEAD_LETTER)"
        ) from None


# -- reading --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One record of a dead-letter file, or one line of a plain JSON-lines file of events."""

    #: Its line in the file (from 1).
    line: int
    #: What identifies it for replay's record of what was delivered (a digest of its bytes).
    key: str
    #: The event's JSON, as it was sent (from ``event``, or an ``event_text`` that is a JSON
    #: object); None when the record holds none (other text, ``event_repr``, a line of JSON
    #: that is no object).
    event: bytes | None
    #: The dead-letter reason; None for a plain event line.
    reason: str | None


@dataclass(frozen=True, slots=True)
class Torn:
    """Bytes that are no record: a record cut short or altered (its frame does not check), or
    a line that is not JSON."""

    line: int
    size: int


def _key(record: bytes) -> str:
    return hashlib.blake2b(record, digest_size=16).hexdigest()


def _framed_entry(line: bytes, number: int, covered: bytes) -> Entry:
    head = orjson.loads(covered[: covered.find(b',"event')] + b"}") if b',"event' in covered else {}
    reason = head.get("reason") if isinstance(head, dict) else None
    at = covered.find(_EVENT_KEY)  # the first is the record's own: strings escape their quotes
    event = covered[at + len(_EVENT_KEY) :] if at != -1 else _text_event(covered)
    return Entry(number, _key(line), event, str(reason) if reason is not None else "")


def _text_event(covered: bytes) -> bytes | None:
    """The bytes of a record's ``event_text`` when that text is a JSON object (a pre-serialized
    event that spanned lines, kept as it was); None for any other text, or none."""
    at = covered.find(_TEXT_KEY)
    if at == -1:
        return None
    try:
        text = orjson.loads(covered[at + len(_TEXT_KEY) :])
    except orjson.JSONDecodeError:
        return None
    return _object_text(text)


def _object_text(text: Any) -> bytes | None:
    """``text``'s bytes if it is the text of a JSON object."""
    try:
        raw = text.encode() if isinstance(text, str) else None
        value = orjson.loads(raw) if raw is not None else None
    except (orjson.JSONDecodeError, UnicodeEncodeError):
        return None
    return raw if isinstance(value, dict) else None


def _legacy_entry(line: bytes, number: int, value: dict[str, Any]) -> Entry:
    event, text = value.get("event"), value.get("event_text")
    body = orjson.dumps(event) if isinstance(event, dict) else None
    if body is None:
        body = _object_text(text)
    return Entry(number, _key(line), body, str(value["reason"]))


def _is_legacy(value: Any) -> bool:
    """A record written before records had a frame (still read)."""
    return isinstance(value, dict) and "reason" in value and "time" in value and "crc32" not in value


def _parse(line: bytes, number: int) -> Iterator[Entry | Torn]:
    covered = _unframed(line)
    if covered is not None:
        yield _framed_entry(line, number, covered)
        return
    # A record glued to a torn one (a writer that did not start a new line): find where it begins.
    at = line.find(_START, 1)
    while at != -1:
        rest = line[at:]
        covered = _unframed(rest)
        if covered is not None:
            yield Torn(number, at)
            yield _framed_entry(rest, number, covered)
            return
        try:
            value = orjson.loads(rest)
        except orjson.JSONDecodeError:
            value = None
        if _is_legacy(value):
            yield Torn(number, at)
            yield _legacy_entry(rest, number, value)
            return
        at = line.find(_START, at + 1)
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        yield Torn(number, len(line))
        return
    if isinstance(value, dict) and "crc32" in value and "reason" in value:
        yield Torn(number, len(line))  # a framed record whose bytes changed
    elif _is_legacy(value):
        yield _legacy_entry(line, number, value)
    elif isinstance(value, dict):
        # Any other object: an event line of a plain file (the outbox judges it, as any event).
        yield Entry(number, _key(line), line, None)
    else:  # (JSON that is no object: no event, and no rerun makes it one)
        yield Entry(number, _key(line), None, None)


def scan(file: IO[bytes]) -> Iterator[Entry | Torn]:
    """The records of a dead-letter file (also one written before records had a frame), or
    the lines of any JSON-lines file of events, in order, with what is torn among them."""
    for number, raw in enumerate(file, 1):
        line = raw.rstrip(b"\r\n")
        if not line.strip():
            continue
        yield from _parse(line, number)
