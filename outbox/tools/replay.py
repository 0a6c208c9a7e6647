"""``outbox replay FILE``: send a dead-letter file (or any JSON-lines file of events) again,
through the transport ``Outbox.from_env()`` configures, at least once, resumable.

* What was delivered is recorded, as it is acknowledged, in ``FILE.replayed`` (one digest of a
  record per line): a second run sends only the rest.  An event whose acknowledgement was not
  seen (cut off by the deadline, or replay itself killed) is sent again by the next run: at
  least once, never "at most".
* ``--timeout`` bounds the whole run, whatever the file's size and the buffer's: events go in
  chunks that fit the outbox's buffer (``OUTBOX_MAX_EVENTS``, ``OUTBOX_MAX_BYTES``), each
  flushed before the next, so ``emit`` never waits for room; what is not delivered by the
  deadline is left for the next run.
* Each event is sent as the file keeps it, byte for byte: a pre-serialized event as it was
  emitted (from ``event``, or from ``event_text`` when its text spans lines).
* Torn records (a writer cut off mid-record) are skipped, with one warning; records that hold no
  JSON event (a line or an ``event_text`` that is not a JSON object, an ``event_repr``) are
  counted, not sent.
* It refuses to run without a configured backend (the console fallback would print every event
  and call it delivered) unless asked for the console (``console=True``); a console run reads
  the record of what was delivered but never writes it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from .. import ConfigError
from .._toolkit import Entry, Torn, progress_path, scan, settings_in_force
from ..transports import Outcome, OutcomeKind, SerializedEvent, Transport

if TYPE_CHECKING:
    from .. import CloseReport

__all__ = ["Busy", "Progress", "replay"]


class Busy(Exception):
    """Another replay is recording into the same progress file."""


_KEY_LEN = 32
#: A replay still sending after this many seconds says what it waits for.
_QUIET = 2.0
# Losses that a setting of the replaying outbox can avoid.
_HINTS = {
    "too_large": "raise OUTBOX_MAX_BATCH_BYTES to send larger events",
}


class Progress:
    """``FILE.replayed``: the digests of the records delivered, one a line, appended as the
    backend acknowledges them.  A torn last line (replay killed mid-write) is ignored, and the
    next write starts a new line."""

    def __init__(self, path: str, *, write: bool = True) -> None:
        self.path = path
        self.done: Counter[str] = Counter()
        self.recorded = 0
        #: Why recording stopped, if it did.
        self.error: str | None = None
        try:
            with open(path, "rb") as file:
                for raw in file:
                    key = raw.strip().decode("ascii", "replace")
                    if len(key) == _KEY_LEN and all(c in "0123456789abcdef" for c in key):
                        self.done[key] += 1
        except FileNotFoundError:
            pass
        self._fd: int | None = None
        self._lock = threading.Lock()
        if write:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                # One replay of a file at a time: two would both send what neither recorded yet.
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise Busy(f"another outbox replay is recording into {path}; wait for it to end") from None
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                os.write(fd, b"\n")
            self._fd = fd

    def add(self, keys: Sequence[str]) -> None:
        """Record ``keys`` as delivered.  Never raises (it runs inside the transport's send): a
        record that cannot be written is kept in ``error``, and those events go again next run."""
        if not keys:
            return
        data = memoryview("".join(key + "\n" for key in keys).encode())
        with self._lock:
            if self._fd is None:
                return
            try:
                while data:
                    data = data[os.write(self._fd, data) :]
            except OSError as exc:
                self.error = f"cannot write {self.path}: {exc.strerror or exc}"
                return
            self.recorded += len(keys)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class _Recording:
    """The configured transport, noting which of the replayed records the backend took."""

    def __init__(self, inner: Transport, progress: Progress, *, console: bool = False) -> None:
        self.inner = inner
        self.console = console
        self.progress = progress
        #: Event body -> the keys of the records (in file order) emitted with that body.
        self.pending: dict[bytes, deque[str]] = {}

    def expect(self, body: bytes, key: str) -> None:
        self.pending.setdefault(body, deque()).append(key)

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        outcomes = await self.inner.send(batch, deadline)
        keys = []
        for event, outcome in zip(batch, outcomes, strict=False):
            if outcome.kind is OutcomeKind.DELIVERED:
                waiting = self.pending.get(event.body)
                if waiting:
                    keys.append(waiting.popleft())
                    if not waiting:
                        del self.pending[event.body]
        self.progress.add(keys)
        return outcomes

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __getattr__(self, name: str) -> Any:  # the transport's hints (lane_events, ...)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return repr(self.inner)


class _DropFallbackWarning(logging.Filter):
    """Replay says itself what to do when nothing is configured."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("no OpenLineage transport is configured")


def _transport(env: Mapping[str, str], console: bool) -> Transport:
    from .._toolkit import logger, resolve_transport_config
    from ..transports import ConsoleTransport, transport_from_config

    if console:
        return ConsoleTransport()
    quiet = _DropFallbackWarning()
    logger.addFilter(quiet)
    try:
        resolved = resolve_transport_config(env)
    finally:
        logger.removeFilter(quiet)
    config = resolved.config or {}
    if resolved.disabled or config.get("type") == "noop":
        raise ConfigError(
            "lineage is disabled (OPENLINEAGE_DISABLED=true, or a noop transport): nothing would be "
            "sent; unset it, or configure the backend to replay into"
        )
    if config == {"type": "console"} and resolved.origins.get("type") == "the default":
        raise ConfigError(
            "no lineage backend is configured: set OPENLINEAGE_URL (or OPENLINEAGE__TRANSPORT__*, "
            "or an openlineage.yml) to the backend to replay into, or pass --console to print the "
            "events instead"
        )
    return transport_from_config(resolved)


def _settings(env: Mapping[str, str]) -> dict[str, Any]:
    from .._toolkit import outbox_settings, validate_one

    settings, origins = outbox_settings(env)
    for keyword, var in origins.items():
        try:
            validate_one(keyword, settings[keyword])
        except ConfigError as exc:
            raise ConfigError(f"{var}: {exc}") from None
    # Not into a dead-letter file: what fails again stays in FILE (not recorded as delivered).
    # Chunks fit the buffer, so "block" never waits; it is there should an estimate be off.
    settings.update(dead_letter=None, name="replay", policy="block", block_timeout=1.0, close_at_exit=False)
    return settings


def replay(
    path: str,
    *,
    timeout: float,
    console: bool = False,
    progress: str | None = None,
    env: Mapping[str, str] | None = None,
    out: TextIO,
    err: TextIO,
) -> int:
    """Replay ``path``; print a summary to ``out`` (to ``err`` with ``console``: the events are
    ``out`` then), problems to ``err``.  Returns the exit
    code: 0 when nothing is left that a rerun would send, 1 otherwise, 2 for bad input."""
    from .. import Outbox

    env = os.environ if env is None else env
    deadline = time.monotonic() + timeout
    progress_file = progress or progress_path(path)
    try:
        file = open(path, "rb")  # noqa: SIM115 (closed below, after the outbox)
    except OSError as exc:
        print(f"outbox replay: cannot read {path}: {exc.strerror or exc}", file=err)
        return 2
    try:
        try:
            inner = _transport(env, console)
            settings = _settings(env)
        except ConfigError as exc:
            print(f"outbox replay: {exc}", file=err)
            return 2
        try:
            record = Progress(progress_file, write=not console)
        except Busy as exc:
            print(f"outbox replay: {exc}", file=err)
            return 2
        except OSError as exc:
            print(
                f"outbox replay: cannot write {progress_file}, where replay records what it delivered "
                f"({exc.strerror or exc}); give --progress PATH somewhere writable",
                file=err,
            )
            return 2
        try:
            transport = _Recording(inner, record, console=console)
            outbox = Outbox(transport, **settings)
            return _run(path, file, outbox, transport, record, deadline, timeout, out, err)
        except ConfigError as exc:
            print(f"outbox replay: {exc}", file=err)
            return 2
        finally:
            record.close()
    finally:
        file.close()


@dataclass
class _Tally:
    """What a replay did with the file's records."""

    torn: list[Torn] = field(default_factory=list)
    already: int = 0
    not_replayable: int = 0
    sent: int = 0
    unsent: int = 0


def _run(
    path: str,
    file: Any,
    outbox: Any,
    transport: _Recording,
    record: Progress,
    deadline: float,
    timeout: float,
    out: TextIO,
    err: TextIO,
) -> int:
    def still_sending() -> None:  # a long wait says what it waits for (once)
        left = max(0.0, deadline - time.monotonic())
        print(
            f"outbox replay: still sending to {transport!r}; waiting up to {left:.0f} s more "
            f"(--timeout {timeout:g}) for it to take the events",
            file=err,
            flush=True,
        )

    waiting = threading.Timer(_QUIET, still_sending)
    waiting.daemon = True
    waiting.start()
    try:
        tally = _send(file, outbox, transport, record.done, deadline)
        report = outbox.close(max(0.0, deadline - time.monotonic()))
    finally:
        waiting.cancel()
    # (One torn line alone is a dead-letter file whose first write was cut off: a crash.)
    if len(tally.torn) > 1 and not (tally.sent or tally.already or tally.not_replayable or tally.unsent):
        print(
            f"outbox replay: {path} holds no record of events ({len(tally.torn)} line(s), none a "
            "record): give a dead-letter file, or JSON lines of OpenLineage events",
            file=err,
        )
        return 2
    _report(path, tally, report, record, timeout, err)
    # With --console the events are standard output: the summary goes beside them, on err.
    print(_summary(path, tally, report, record, timeout), file=err if transport.console else out, flush=True)
    return 0 if report.complete and not tally.unsent else 1


def _report(
    path: str, tally: _Tally, report: CloseReport, record: Progress, timeout: float, err: TextIO
) -> None:
    """The replay's problems, on ``err``: torn records, and progress that could not be recorded."""
    if tally.torn:
        torn = tally.torn
        lines = ", ".join(str(t.line) for t in torn[:10]) + (", ..." if len(torn) > 10 else "")
        print(
            f"outbox replay: skipped {len(torn)} torn record(s) in {path} (line {lines}): a writer was "
            "cut off mid-record (a crash or a full disk); what they held cannot be recovered",
            file=err,
        )
    if record.error:
        print(
            f"outbox replay: {record.error}: events delivered since are not recorded, and a rerun "
            "sends them again",
            file=err,
        )


def _summary(path: str, tally: _Tally, report: CloseReport, record: Progress, timeout: float) -> str:
    """The replay's one summary line: what was delivered, and what is left for the next run."""
    # Nothing is lost here: what was not delivered is not recorded, so it stays for a rerun.
    left = dict(report.undelivered)
    said = f"replayed {tally.sent} events from {path}: delivered {report.delivered}"
    if left:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(left.items()))
        said += (
            f", {sum(left.values())} not delivered ({reasons}), left in {path} for the next run"
            + "".join(f" ({_HINTS[r]})" for r in left if r in _HINTS)
        )
    else:
        said += ", none left undelivered"
    parts = [said]
    if tally.already:
        parts.append(f"{tally.already} delivered by an earlier run, skipped (see {record.path})")
    if tally.unsent:
        parts.append(
            f"{tally.unsent} not sent by the deadline (--timeout {timeout:g}): run again to send them"
        )
    if tally.not_replayable:
        parts.append(
            f"{tally.not_replayable} record(s) hold no JSON event (a line or an event_text that is "
            "not a JSON object, or event_repr): not sent"
        )
    return "; ".join(parts)


def _send(file: Any, outbox: Any, transport: _Recording, done: Counter[str], deadline: float) -> _Tally:
    """Emit the file's events not ``done`` yet, in chunks the outbox's buffer holds, each
    flushed before the next; what is left when the deadline comes is counted unsent."""
    limits = settings_in_force(outbox)
    max_events, max_bytes = int(limits["max_events"]), int(limits["max_bytes"])
    tally = _Tally()
    chunk: list[Entry] = []
    chunk_bytes = 0
    stopped = False

    def send_chunk() -> bool:
        for entry in chunk:
            assert entry.event is not None
            transport.expect(entry.event, entry.key)
            outbox.emit(entry.event)
        tally.sent += len(chunk)
        chunk.clear()
        return bool(outbox.flush(max(0.0, deadline - time.monotonic())))

    for item in scan(file):
        if isinstance(item, Torn):
            tally.torn.append(item)
            continue
        if item.event is None:
            tally.not_replayable += 1
            continue
        if done[item.key] > 0:
            done[item.key] -= 1
            tally.already += 1
            continue
        if stopped:
            tally.unsent += 1
            continue
        size = len(item.event)
        if chunk and (len(chunk) >= max_events or chunk_bytes + size > max_bytes):
            chunk_bytes = 0
            if not send_chunk():
                stopped = True  # the deadline: the rest is left for the next run
                tally.unsent += 1
                continue
        chunk.append(item)
        chunk_bytes += size
    if chunk:
        send_chunk()
    return tally
