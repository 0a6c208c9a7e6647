"""Logging at a bounded rate (a dead backend gives one warning per interval, with counts), and
the records that must never be silent.

The application decides where the ``outbox`` logger's records go, with one exception: a
record marked :data:`NEVER_SILENT` (a loss at close or at exit, a one-time warning such as a
misspelt setting) that no handler of the application would see is written to stderr, one
line, by :class:`LastResort`.  ``logging.lastResort`` does the same for every record of a
program that configured nothing, but a library's logger has a handler of its own (else
every program would print every retry warning), which keeps ``lastResort`` away.
"""

from __future__ import annotations

import logging
import sys
import time

__all__ = [
    "FIRST_NEVER_SILENT",
    "NEVER_SILENT",
    "LastResort",
    "RateLimitFilter",
    "RateLimitedLog",
    "described",
    "limit_library_logs",
    "logger",
    "never_silent",
]

logger = logging.getLogger("outbox")

#: The attribute that marks a record as one that must reach someone (``never_silent``).
NEVER_SILENT = "outbox_never_silent"

#: The keys of a :class:`RateLimitedLog` whose first record in each log is never silent: a
#: spill directory or a dead-letter file that cannot be written or read (``_spill._disk``,
#: ``_spill._window``, ``_spill._spill``, ``_deadletter``).  Later ones follow the log's rate only.
FIRST_NEVER_SILENT = frozenset(
    {"spill-failed", "spill-read", "spill-adopt", "spill-unsettled", "dead-letter"}
)


def described(exc: BaseException) -> str:
    """The message of an exception that may come from the application's objects (an event's,
    a transport's); if its ``__str__`` raises, a text naming its class: describing it never
    raises in the sidecar (that jammed the worker on one event)."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__} whose message could not be read>"


def never_silent(level: int, msg: str, *args: object) -> None:
    """Log on the ``outbox`` logger a record that reaches stderr when no handler of the
    application would see it (see :class:`LastResort`)."""
    logger.log(level, msg, *args, extra={NEVER_SILENT: True})


class LastResort(logging.Handler):
    """The ``outbox`` logger's own handler: writes the records marked :data:`NEVER_SILENT` to
    stderr, one line each, when no other handler is on their way up (their logger's, then
    its parents' while they propagate, the root logger's last).  An application that
    configured logging (``logging.basicConfig``, a handler on ``outbox``, even a
    ``NullHandler`` there to silence it) gets them through its own handlers instead, so
    nothing is printed twice.  Every other record stays the application's to route."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, NEVER_SILENT, False) or self._others_see(record.name):
            return
        stream = sys.stderr  # looked up now: a program may have replaced it
        if stream is None:  # (pythonw)
            return
        try:
            message = " ".join(record.getMessage().splitlines())
            stream.write(f"lineage-outbox {record.levelname.lower()}: {message}\n")
            stream.flush()
        except Exception:
            self.handleError(record)

    def _others_see(self, name: str) -> bool:
        """Whether a handler other than this one is on the way of a record of logger ``name``."""
        found = logging.Logger.manager.loggerDict.get(name)
        current: logging.Logger | None = found if isinstance(found, logging.Logger) else logger
        while current is not None:
            if any(handler is not self for handler in current.handlers):
                return True
            current = current.parent if current.propagate else None
        return False


logger.addHandler(LastResort())


class RateLimitedLog:
    """At most one record per key and interval; the next one says how many were held back."""

    def __init__(self, interval: float, log: logging.Logger = logger, prefix: str = "") -> None:
        self.interval = interval
        self._log = log
        #: Said before every message (a composite member's name, to tell its warnings apart).
        self.prefix = prefix
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._told: set[str] = set()  # keys of FIRST_NEVER_SILENT already logged

    def log(self, level: int, key: str, msg: str, *args: object) -> bool:
        """Log unless ``key`` was logged less than ``interval`` ago.  Returns True if logged."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            msg += " (%d similar messages held back in the last %g s)"
            args = (*args, held, self.interval)
        extra = None
        if key in FIRST_NEVER_SILENT and key not in self._told:
            self._told.add(key)
            extra = {NEVER_SILENT: True}
        self._log.log(level, self.prefix + msg, *args, extra=extra)
        return True

    def warning(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def error(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.ERROR, key, msg, *args)


class RateLimitFilter(logging.Filter):
    """Lets each message template through at most once per ``interval`` (per logger).

    Attached to aiokafka's loggers by the Kafka transport: with the broker down, aiokafka
    logs an ERROR for every reconnection attempt, several a second, and we promise a
    bounded rate.  Likewise to openlineage-python's HTTP logger when one of its token
    providers is used: it logs an ERROR for every token it fails to fetch, one per retry.
    """

    def __init__(self, interval: float) -> None:
        super().__init__()
        self.interval = interval
        self._last: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            return False
        if len(self._last) > 1000:  # templates are few; bound it anyway
            self._last.clear()
        self._last[key] = now
        return True


_limited: set[str] = set()


def limit_library_logs(*names: str, interval: float = 30.0) -> None:
    """Rate-limit the named loggers, once per process (a logger's filter sees only the records
    logged on that very logger, so name each module's logger)."""
    for name in names:
        if name not in _limited:
            _limited.add(name)
            logging.getLogger(name).addFilter(RateLimitFilter(interval))
