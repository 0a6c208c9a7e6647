"""Transports: where the outbox's worker ships batches.

Each is an object with ``async send(batch, deadline) -> outcomes`` and
``async aclose()`` (see :class:`outbox.Transport`).

This folder owns the protocol and the outcomes (``_base``), each backend's transport (``http``,
with its private parts in ``_http/``; ``kafka``; ``console``, ``file``, ``memory``;
``composite``; ``adapter`` for openlineage-python's own transports) and
``transport_from_config``.  It may import ``outbox._config`` (the configuration readers),
``outbox._runtime`` (threads, slices), ``outbox._run`` (``SerializedEvent``),
``outbox._observability`` and ``outbox._errors``; the worker imports it, never the reverse.
"""

from __future__ import annotations

from typing import Any

from .._config._config import ResolvedTransport, openlineage_flag
from .._errors import ConfigError
from ._base import DELIVERED, About, Outcome, OutcomeKind, SerializedEvent, Transport
from .adapter import OpenLineageTransportAdapter
from .composite import CompositeTransport
from .console import ConsoleTransport
from .file import FileTransport
from .http import HttpTransport
from .kafka import KafkaTransport
from .memory import MemoryTransport

__all__ = [
    "DELIVERED",
    "About",
    "CompositeTransport",
    "ConsoleTransport",
    "FileTransport",
    "HttpTransport",
    "KafkaTransport",
    "MemoryTransport",
    "OpenLineageTransportAdapter",
    "Outcome",
    "OutcomeKind",
    "SerializedEvent",
    "Transport",
    "transport_from_config",
]

_FILE_KEYS = {"type", "log_file_path", "append"}
_SUPPORTED_TYPES = ("console", "file", "http", "async_http", "kafka", "composite")
#: openlineage-python transports run through OpenLineageTransportAdapter (and any module.Class).
_OPENLINEAGE_ONLY = ("transform", "msk-iam", "amazon_datazone_api", "gcplineage", "datadog")


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
    if kind == "composite":
        return _composite(resolved)
    if kind == "file":
        if set(config) - _FILE_KEYS - {"name", "priority"}:
            # Remote storage (storage_options) and the other openlineage-python file features:
            # its own FileTransport, behind the outbox.
            return OpenLineageTransportAdapter.from_config(resolved)
        path = config.get("log_file_path")
        if not isinstance(path, str) or not path:
            raise ConfigError(
                f"the file transport needs a log_file_path; set {resolved.origin('log_file_path')} "
                f"(got {path!r})"
            )
        append = openlineage_flag(resolved.origin("append"), config.get("append", False))
        return FileTransport(path, append=append)
    if isinstance(kind, str) and (kind in _OPENLINEAGE_ONLY or "." in kind):
        # openlineage-python's own transport, built by its factory, behind the outbox.
        return OpenLineageTransportAdapter.from_config(resolved)
    raise ConfigError(
        f"{resolved.origin('type')}={kind!r} is not a transport lineage-outbox supports; "
        f"use one of {', '.join(_SUPPORTED_TYPES)} (or OPENLINEAGE_DISABLED=true to turn lineage off)"
    )


def _composite(resolved: ResolvedTransport) -> Transport:
    """openlineage-python's ``composite``: ``transports`` as a mapping (names are its keys)
    or a list (each may carry a ``name``), ``continue_on_failure``, ``continue_on_success``
    and ``sort_transports`` (by each member's ``priority``, highest first)."""
    config = resolved.config or {}
    listed = config.get("transports")
    where = resolved.origin("transports")
    # (name, its key in transports: a mapping's key or a list's index, the member's config)
    if isinstance(listed, dict):
        entries = [(str(key), key, member) for key, member in listed.items() if member]
    elif isinstance(listed, list):
        entries = [
            (str(member.get("name") or f"{member.get('type')}-{i}"), i, member)
            if isinstance(member, dict)
            else (str(i), i, member)
            for i, member in enumerate(listed)
        ]
    else:
        raise ConfigError(
            f"{where}: a composite transport needs transports, a mapping of name to transport config "
            '(such as {"marquez": {"type": "http", "url": "http://marquez:5000"}}) or a list of them'
        )
    if not entries:
        raise ConfigError(f"{where}: a composite transport needs at least one member transport")
    flags = {}
    for key, default in (
        ("continue_on_failure", True),
        ("continue_on_success", True),
        ("sort_transports", False),
    ):
        flags[key] = openlineage_flag(resolved.origin(key), config.get(key, default))
    members: list[tuple[int, str, Transport]] = []
    for name, key, member in entries:
        if not isinstance(member, dict) or not member.get("type"):
            where = resolved.named("transports", key)
            raise ConfigError(f"{where}: the member {name!r} needs a transport config with a type")
        # A member may be a composite itself, as in openlineage-python (its factory builds any).
        priority = member.get("priority", 0)
        body = {k: value for k, value in member.items() if k not in ("name", "priority")}
        try:
            rank = int(priority)
        except (TypeError, ValueError):
            where = resolved.named("transports", key, "priority")
            raise ConfigError(f"{where}={priority!r} is not a whole number") from None
        member_config = ResolvedTransport(body, resolved.sources, path=(*resolved.path, "transports", key))
        members.append((rank, name, transport_from_config(member_config)))
    if flags["sort_transports"]:
        members.sort(key=lambda entry: -entry[0])
    return CompositeTransport(
        {name: transport for _, name, transport in members},
        continue_on_failure=flags["continue_on_failure"],
        continue_on_success=flags["continue_on_success"],
    )
