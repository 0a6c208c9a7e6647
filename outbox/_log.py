"""Logging at a bounded rate: a dead backend gives one warning per interval, with counts."""

from __future__ import annotations

import logging
import time

__all__ = ["RateLimitedLog", "logger"]

logger = logging.getLogger("outbox")
# A library configures no output of its own: the application decides where "outbox" goes.
logger.addHandler(logging.NullHandler())


class RateLimitedLog:
    """At most one record per key and interval; the next one says how many were held back."""

    def __init__(self, interval: float, log: logging.Logger = logger) -> None:
        self.interval = interval
        self._log = log
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
        self._log.log(level, msg, *args)
        return True

    def warning(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def error(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.ERROR, key, msg, *args)
