"""What the tools (``outbox/tools/``: ``check``, ``replay``, ``forward``, ``bench`` and the
benchmarks) use of the library beyond its public API: one declared surface, so that the
library's parts can change behind it and the tools stay apart from its import plan.

Nothing here is new: each name is the library's own, re-exported (the tools check and send the
way the outbox does), plus :func:`settings_in_force`, which reads an outbox's settings for
``outbox check`` and ``outbox replay``.  ``tests/test_structure.py`` pins that the tools import
the library through ``outbox``, ``outbox.transports`` and this module (at most three tool files
reach anything else private).  The library never imports this module."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ._config._config import ResolvedTransport, outbox_settings, resolve_transport_config
from ._config._settings import validate_one
from ._observability._deadletter import Entry, Torn, progress_path, scan
from ._observability._log import RateLimitedLog, limit_library_logs, logger
from ._run._run import Run, RunRecord
from ._run._serde import serialize
from ._spill import inspect_dir
from ._worker._retry import NO_TIME_LEFT, backoff_delay, close_paced
from .transports._http._settings import (
    checked_url,
    environment_proxy,
    header_problem,
    redact_url,
    secret_text,
)
from .transports.kafka import producer_settings

if TYPE_CHECKING:
    from ._outbox import Outbox

__all__ = [
    "NO_TIME_LEFT",
    "Entry",
    "RateLimitedLog",
    "ResolvedTransport",
    "Run",
    "RunRecord",
    "Torn",
    "backoff_delay",
    "checked_url",
    "close_paced",
    "environment_proxy",
    "header_problem",
    "inspect_dir",
    "limit_library_logs",
    "logger",
    "outbox_settings",
    "producer_settings",
    "progress_path",
    "redact_url",
    "resolve_transport_config",
    "scan",
    "secret_text",
    "serialize",
    "settings_in_force",
    "validate_one",
]


def settings_in_force(outbox: Outbox) -> dict[str, Any]:
    """The values an outbox holds, by ``Outbox`` keyword: its limits, dead-letter and spill
    settings, its worker's keywords and its name (a keyword it keeps nowhere readable, such as
    ``close_at_exit``, is absent)."""
    assembly = outbox._assembly
    held: dict[str, Any] = {
        field.name: getattr(assembly.settings, field.name) for field in dataclasses.fields(assembly.settings)
    }
    held["name"] = assembly.name
    held.update(assembly.effective_settings())
    return held
