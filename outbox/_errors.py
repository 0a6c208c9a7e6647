"""Exceptions raised by lineage-outbox.

The tree is deliberately small::

    OutboxError
     └── ConfigError      bad configuration, raised at construction time

Backend trouble never becomes an exception in the caller: it is counted in
:meth:`Outbox.stats` and logged at a bounded rate.  The only exception ``emit``
raises is :class:`TypeError`, for an object that is not an event at all.

Example::

    try:
        outbox = Outbox.from_env()
    except ConfigError as exc:
        sys.exit(f"lineage is misconfigured: {exc}")
"""

from __future__ import annotations

__all__ = ["ConfigError", "OutboxError"]


class OutboxError(Exception):
    """Base class of every error this library raises on purpose."""


class ConfigError(OutboxError, ValueError):
    """A configuration value is missing or invalid.

    The message names the setting (a keyword argument or an environment
    variable), the offending value and what would be accepted instead.
    """
