"""Transports: where the outbox's worker ships batches.

Each is an object with ``async send(batch, deadline) -> outcomes`` and
``async aclose()`` (see :class:`outbox.Transport`).
"""

from __future__ import annotations

from typing import Any

from .._config import ResolvedTransport
from .._errors import ConfigError
from ._base import DELIVERED, Outcome, OutcomeKind, SerializedEvent, Transport
from .console import ConsoleTransport
from .file import FileTransport
from .http import HttpTransport
from .kafka import KafkaTransport
from .memory import MemoryTransport

__all__ = [
    "DELIVERED",
    "ConsoleTransport",
    "FileTransport",
    "HttpTransport",
    "KafkaTransport",
    "MemoryTransport",
    "Outcome",
    "OutcomeKind",
    "SerializedEvent",
    "Transport",
    "transport_from_config",
]

_FILE_KEYS = {"type", "log_file_path", "append"}
_SUPPORTED_TYPES = ("console", "file", "http", "async_http", "kafka")


def transport_from_config(resolved: ResolvedTransport) -> Transport:
    """Build the transport an openlineage-python style config describes.

    Raises:
        ConfigError: an unknown type, a missing key or an invalid value, naming the
            setting it came from.
    """
    config: dict[str, Any] = resolved.config or {}
    kind = config.get("type")
    if kind == "console":
        return ConsoleTransport()
    if kind in ("http", "async_http"):
        return HttpTransport.from_config(resolved)
    if kind == "kafka":
        return KafkaTransport.from_config(resolved)
    if kind == "file":
        unknown = sorted(set(config) - _FILE_KEYS)
        if unknown:
            raise ConfigError(
                f"{resolved.origin(unknown[0])}: the file transport does not support {unknown[0]!r} "
                "(remote file systems and debug_mode are openlineage-python features); "
                "it takes log_file_path and append"
            )
        path = config.get("log_file_path")
        if not isinstance(path, str) or not path:
            raise ConfigError(
                f"the file transport needs a log_file_path; set OPENLINEAGE__TRANSPORT__LOG_FILE_PATH "
                f"(got {path!r})"
            )
        append = config.get("append", False)
        if not isinstance(append, bool):
            raise ConfigError(f"{resolved.origin('append')}={append!r} is not a boolean; use true or false")
        return FileTransport(path, append=append)
    raise ConfigError(
        f"{resolved.origin('type')}={kind!r} is not a transport lineage-outbox supports; "
        f"use one of {', '.join(_SUPPORTED_TYPES)} (or OPENLINEAGE_DISABLED=true to turn lineage off)"
    )
