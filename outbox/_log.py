"""Logging at a bounded rate: a dead backend gives one warning per interval, with counts."""

from __future__ import annotations

import logging
import time

__all__ = ["RateLimitFilter", "RateLimitedLog", "limit_library_logs", "logger"]

logger = logging.getLogger("outbox")
# A library configures no output of its own: the application decides where "outbox" goes.
logger.addHandler(logging.NullHandler())


class RateLimitedLog:
    """At most one record per key and interval; the next one says how many were held back."""

    def __init__(self, interval: float, log: logging.Logger = logger, prefix: str = "") -> None:
        self.interval = interval
        self._log = log
        #: Said before every message (a composite member's name, to tell its warnings apart).
        self.prefix = prefix
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

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
        self._log.log(level, self.prefix + msg, *args)
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
