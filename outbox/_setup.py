"""How an ``Outbox`` is put together (:class:`Assembly`, which the outbox has): its keywords checked
(each bad one a :class:`ConfigError` naming it, the value and the fix; the worker's knobs by
``_config._settings``), the settings in force reported, and the parts of one process built from them:
the buffer (fed first with what a dead process left in the spill), its metrics, a composite's
members, the sidecar; built at construction, and again in a forked child (whose parent keeps
its own).  What an outbox does with them (``emit``, ``flush``, ``close``, ``stats``) is
``_outbox``'s."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from ._buffer._buffer import Buffer, Reason
from ._config._settings import (
    Keywords,
    Limits,
    WorkerSettings,
    check_number,
    from_variables,
    in_force,
    resolve,
)
from ._errors import ConfigError
from ._observability._deadletter import DEFAULT_MAX_BYTES as DEAD_LETTER_MAX_BYTES
from ._observability._deadletter import DeadLetter
from ._observability._log import logger
from ._observability._metrics import Metrics
from ._runtime._lifecycle import INHERITED
from ._spill import DEFAULT_INTERVAL as SPILL_INTERVAL
from ._spill import DEFAULT_MAX_BYTES as SPILL_MAX_BYTES
from ._spill import Spill
from ._worker._fanout import FanOut, fans_out
from ._worker._sidecar import Sidecar, State
from .transports._base import Transport

__all__ = [
    "DEAD_LETTER_MAX_BYTES",
    "SPILL_INTERVAL",
    "SPILL_MAX_BYTES",
    "Assembly",
    "MiB",
    "Parts",
    "build_parts",
    "check_transport",
    "from_environment",
    "make_dead_letter",
    "make_spill",
    "settings_in_force",
    "transport_for_child",
]

T = TypeVar("T")
MiB = 1024 * 1024


def check_transport(transport: Any) -> None:
    if isinstance(transport, type):  # (its methods are there, unbound: every send would fail)
        raise ConfigError(
            f"transport={transport.__name__} is a class, not a transport; pass an instance, "
            f"e.g. {transport.__name__}(...) (outbox.transports.HttpTransport('http://marquez:5000'))"
        )
    if not isinstance(transport, Transport):
        raise ConfigError(
            f"transport={transport!r} is not a transport; pass an object with "
            "'async send(batch, deadline)' and 'async aclose()', such as outbox.transports.HttpTransport"
        )


def make_dead_letter(path: Any, max_bytes: Any, log_interval: float) -> DeadLetter | None:
    """The dead-letter file ``dead_letter=path`` asks for (None: off), checked for writing."""
    check_number("dead_letter_max_bytes", max_bytes, minimum=1, integer=True)
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ConfigError(f"dead_letter={path!r} is not a path; pass the path of a JSON-lines file")
    # A directory, a missing folder, an unwritable one: a ConfigError naming the path.
    return DeadLetter(path, log_interval, max_bytes)


def make_spill(directory: Any, max_bytes: Any, interval: Any, log_interval: float) -> Spill | None:
    """The spill ``spill_dir=directory`` asks for (None: off), made if missing, checked for writing."""
    check_number("max_spill_bytes", max_bytes, minimum=1, integer=True)
    check_number("spill_interval", interval, minimum=0, above=True)
    if directory is None:
        return None
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        raise ConfigError(
            f"spill_dir={directory!r} is not a path; pass the path of a directory on local disk"
        )
    return Spill(directory, max_bytes=max_bytes, interval=float(interval), log_interval=log_interval)


def settings_in_force(
    limits: Limits,
    settings: WorkerSettings,
    shutdown_timeout: float,
    dead_letter: DeadLetter | None,
    dead_letter_max_bytes: int,
    spill: Spill | None,
) -> dict[str, Any]:
    """The settings in force, by ``Outbox`` keyword (for ``outbox check``)."""
    path = dead_letter.path if dead_letter is not None else None
    found = in_force(limits, settings, shutdown_timeout, path, dead_letter_max_bytes)
    if spill is not None:
        found["spill_dir"] = spill.directory
        found["max_spill_bytes"] = spill.max_bytes
        found["spill_interval"] = spill.interval
    return found


def from_environment(
    make: Callable[..., T], env: Mapping[str, str], overrides: dict[str, Any], *, read_files: bool
) -> T:
    """An outbox made by ``make`` (the ``Outbox`` class) from openlineage-python's transport
    configuration and the ``OUTBOX_*`` variables (see ``Outbox.from_env``)."""
    from ._config._config import resolve_transport_config
    from .transports import MemoryTransport, transport_from_config

    settings = from_variables(env, overrides)
    resolved = resolve_transport_config(env, read_files=read_files)
    if resolved.disabled or (resolved.config or {}).get("type") == "noop":
        outbox = make(MemoryTransport(), **settings)
        buf = outbox._buffer  # type: ignore[attr-defined]
        with buf.lock:
            buf.close_locked(Reason.DISABLED)
        return outbox
    return make(transport_from_config(resolved), **settings)


class Parts(NamedTuple):
    """One process's parts of an outbox."""

    buffer: Buffer
    metrics: Metrics
    sidecar: Sidecar


def build_parts(
    transport: Transport,
    name: str,
    limits: Limits,
    settings: WorkerSettings,
    *,
    shutdown_timeout: float,
    close_at_exit: bool,
    dead_letter: DeadLetter | None,
    spill: Spill | None,
) -> Parts:
    """Build the buffer, metrics, a composite's members and the sidecar of one process."""
    buffer = Buffer(
        max_events=limits.max_events,
        max_bytes=limits.max_bytes,
        policy=limits.policy,
        block_timeout=limits.block_timeout,
    )
    if spill is not None:
        # Events of a process that died with this spill directory go first.
        spill.attach(buffer)
    metrics = Metrics(name, buffer, spill)
    members = None
    if fans_out(transport):
        # Each member its own buffer, worker and thread; this outbox's worker is their intake.
        members = FanOut.build(
            transport,  # type: ignore[arg-type]
            name,
            max_events=limits.max_events,
            max_bytes=limits.max_bytes,
            policy=limits.policy,
            settings=settings,
            shutdown_timeout=shutdown_timeout,
            dead_letter=dead_letter,
        )
    sidecar = Sidecar(
        buffer,
        members.hand_off if members is not None else transport,
        settings,
        metrics,
        name=name,
        shutdown_timeout=shutdown_timeout,
        close_at_exit=close_at_exit,
        dead_letter=dead_letter,
        members=members,
        spill=spill,
    )
    return Parts(buffer, metrics, sidecar)


def transport_for_child(transport: Transport, parent: Sidecar) -> Transport:
    """The transport a forked child sends through: a fresh one built from the same
    configuration (``clone()``), else the parent's object, with a warning if it was in use."""
    clone = getattr(transport, "clone", None)
    if callable(clone):
        child: Transport = clone()
        return child
    if parent.state is not State.NEW:
        logger.warning("%r has no clone(): the forked child shares its parent's transport object", transport)
    return transport


class Assembly:
    """How an :class:`~outbox.Outbox` is made; the outbox has one.  It holds the keywords
    checked and resolved (``Outbox.__init__`` hands them over, with their defaults), reports
    the settings in force, and builds this process's parts (:attr:`parts`), again in a forked
    child.  It never refers to its outbox: what the outbox reads on ``emit``'s path it takes
    from :attr:`parts` into its own attributes."""

    def __init__(self, transport: Transport, keywords: Keywords) -> None:
        check_transport(transport)
        k = keywords
        self.limits, self.settings = resolve(k)
        self.dead_letter = make_dead_letter(k.dead_letter, k.dead_letter_max_bytes, float(k.log_interval))
        self.dead_letter_max_bytes = k.dead_letter_max_bytes
        self.spill = make_spill(k.spill_dir, k.max_spill_bytes, k.spill_interval, float(k.log_interval))
        self.transport = transport
        self.name = k.name
        self.shutdown_timeout = float(k.shutdown_timeout)
        self.close_at_exit = k.close_at_exit
        self.parts = self._build()

    def _build(self) -> Parts:
        """Everything that belongs to one process: buffer, metrics, sidecar."""
        return build_parts(
            self.transport,
            self.name,
            self.limits,
            self.settings,
            shutdown_timeout=self.shutdown_timeout,
            close_at_exit=self.close_at_exit,
            dead_letter=self.dead_letter,
            spill=self.spill,
        )

    def effective_settings(self) -> dict[str, Any]:
        """The settings in force, by ``Outbox`` keyword (for ``outbox check``)."""
        return settings_in_force(
            self.limits,
            self.settings,
            self.shutdown_timeout,
            self.dead_letter,
            self.dead_letter_max_bytes,
            self.spill,
        )

    def rebuild_in_child(self) -> None:
        """Build this (forked) process's parts afresh.  The parent's sidecar thread does not
        exist here; its locks may be held; its loop and transport belong to the parent.  Start
        over, empty, with a fresh transport built from the same configuration: the parent
        still owns (and delivers) what it had buffered."""
        old = self.parts.sidecar
        INHERITED.append((old, self.transport))
        self.transport = transport_for_child(self.transport, old)
        if self.spill is not None:
            self.spill = self.spill.for_child()
        self.parts = self._build()
        if old.state in (State.CLOSING, State.CLOSED):
            buffer, sidecar = self.parts.buffer, self.parts.sidecar
            with buffer.lock:
                buffer.close_locked()
            sidecar.state = State.CLOSED
            sidecar.report = old.report
