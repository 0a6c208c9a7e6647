"""The outbox's settings: the buffer's limits, and the checks every keyword (and the
``OUTBOX_*`` variable behind it) goes through, so bad input fails at construction, named."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._buffer._buffer import Policy
from .._errors import ConfigError

__all__ = [
    "Keywords",
    "Limits",
    "WorkerSettings",
    "check_number",
    "from_variables",
    "in_force",
    "resolve",
    "validate_one",
]

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Keywords:
    """``Outbox``'s keywords as given, unchecked: ``Outbox.__init__`` hands them over whole (its
    signature holds the defaults), :func:`resolve` checks them."""

    max_events: int
    max_bytes: int
    policy: Policy | str
    block_timeout: float
    max_batch_events: int | None
    max_batch_bytes: int | None
    linger: float
    shutdown_timeout: float
    send_timeout: float
    backoff_base: float
    backoff_cap: float
    max_retry_after: float
    poison_attempts: int
    max_concurrency: int
    circuit_threshold: int
    log_interval: float
    dead_letter: str | os.PathLike[str] | None
    dead_letter_max_bytes: int
    spill_dir: str | os.PathLike[str] | None
    max_spill_bytes: int
    spill_interval: float
    close_at_exit: bool
    name: str


@dataclass(frozen=True, slots=True)
class Limits:
    max_events: int
    max_bytes: int
    policy: Policy
    block_timeout: float


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """The worker's keywords, checked (``resolve``): batches, linger, timeouts, backoff, the
    breaker, poison and lanes."""

    max_batch_events: int
    max_batch_bytes: int
    linger: float
    send_timeout: float
    backoff_base: float
    backoff_cap: float
    circuit_threshold: int
    log_interval: float
    max_retry_after: float = 300.0
    poison_attempts: int = 5
    max_concurrency: int = 8


#: The most seconds any of the outbox's times may be: a year.  Past it a deadline overflows the
#: platform's clock in a wait (``OverflowError`` out of ``emit`` or ``close``); NaN compares with
#: nothing (a wait that never ends, a send that always times out): both refused.
MAX_SECONDS = 365 * 24 * 3600


def check_number(name: str, value: Any, *, minimum: float, integer: bool = False, above: bool = False) -> Any:
    """``value`` if it is an integer (``integer``) or a number of seconds at least ``minimum``
    (more, if ``above``), and seconds at most ``MAX_SECONDS``; else a ConfigError naming it."""
    kind = "an integer" if integer else "a number of seconds"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    accepted = f"{kind} {'>' if above else '>='} {minimum:g}" + ("" if integer else f" and <= {MAX_SECONDS}")
    if isinstance(value, bool) or not ok_type:
        raise ConfigError(f"{name}={value!r} is not {kind}; pass {accepted}")
    if value < minimum or (above and value == minimum) or not (integer or value <= MAX_SECONDS):
        raise ConfigError(f"{name}={value!r} is out of range; pass {accepted}")
    return value


def validate_one(keyword: str, value: Any) -> None:
    if keyword == "policy":
        try:
            Policy(value)
        except ValueError:
            accepted = ", ".join(p.value for p in Policy)
            raise ConfigError(f"{value!r} is not a policy; use one of {accepted}") from None
        return
    integers = {
        "max_events",
        "max_bytes",
        "max_batch_events",
        "max_batch_bytes",
        "circuit_threshold",
        "poison_attempts",
        "max_concurrency",
        "dead_letter_max_bytes",
        "max_spill_bytes",
    }
    if keyword in integers:
        check_number(keyword, value, minimum=1, integer=True)
    elif keyword in ("send_timeout", "spill_interval"):
        check_number(keyword, value, minimum=0, above=True)
    elif keyword not in ("name", "close_at_exit", "dead_letter", "spill_dir"):
        check_number(keyword, value, minimum=0)


def resolve(keywords: Keywords) -> tuple[Limits, WorkerSettings]:
    """``Outbox``'s keywords checked (a ``ConfigError`` naming the first that is wrong, and
    what is accepted), with the batch defaults filled in."""
    k = keywords
    max_events, max_bytes = k.max_events, k.max_bytes
    max_batch_events, max_batch_bytes = k.max_batch_events, k.max_batch_bytes
    try:
        policy = Policy(k.policy)
    except ValueError:
        accepted = ", ".join(repr(p.value) for p in Policy)
        raise ConfigError(f"policy={k.policy!r} is not a policy; pass one of {accepted}") from None
    check_number("max_events", max_events, minimum=1, integer=True)
    check_number("max_bytes", max_bytes, minimum=1, integer=True)
    if max_batch_events is None:
        max_batch_events = min(1000, max_events)
    if max_batch_bytes is None:
        max_batch_bytes = min(1 * MiB, max_bytes)
    check_number("block_timeout", k.block_timeout, minimum=0)
    check_number("max_batch_events", max_batch_events, minimum=1, integer=True)
    check_number("max_batch_bytes", max_batch_bytes, minimum=1, integer=True)
    check_number("linger", k.linger, minimum=0)
    check_number("shutdown_timeout", k.shutdown_timeout, minimum=0)
    check_number("send_timeout", k.send_timeout, minimum=0, above=True)
    check_number("backoff_base", k.backoff_base, minimum=0)
    check_number("backoff_cap", k.backoff_cap, minimum=0)
    check_number("max_retry_after", k.max_retry_after, minimum=0)
    check_number("poison_attempts", k.poison_attempts, minimum=1, integer=True)
    check_number("max_concurrency", k.max_concurrency, minimum=1, integer=True)
    check_number("circuit_threshold", k.circuit_threshold, minimum=1, integer=True)
    check_number("log_interval", k.log_interval, minimum=0)
    _check_batch_fits(max_events, max_bytes, max_batch_events, max_batch_bytes)
    settings = WorkerSettings(
        max_batch_events=max_batch_events,
        max_batch_bytes=max_batch_bytes,
        linger=float(k.linger),
        send_timeout=float(k.send_timeout),
        backoff_base=float(k.backoff_base),
        backoff_cap=float(k.backoff_cap),
        circuit_threshold=k.circuit_threshold,
        log_interval=float(k.log_interval),
        max_retry_after=float(k.max_retry_after),
        poison_attempts=k.poison_attempts,
        max_concurrency=k.max_concurrency,
    )
    return Limits(max_events, max_bytes, policy, float(k.block_timeout)), settings


def _check_batch_fits(max_events: int, max_bytes: int, max_batch_events: int, max_batch_bytes: int) -> None:
    if max_batch_events > max_events:
        raise ConfigError(
            f"max_batch_events={max_batch_events} exceeds max_events={max_events}; "
            "a batch must fit in the buffer: lower max_batch_events or raise max_events"
        )
    if max_batch_bytes > max_bytes:
        raise ConfigError(
            f"max_batch_bytes={max_batch_bytes} exceeds max_bytes={max_bytes}; "
            "a batch must fit in the buffer: lower max_batch_bytes or raise max_bytes"
        )


def from_variables(env: Mapping[str, str], overrides: dict[str, Any]) -> dict[str, Any]:
    """``Outbox`` keywords from the ``OUTBOX_*`` variables of ``env``, each checked (a
    ``ConfigError`` naming the variable), then ``overrides`` (keywords, checked by ``Outbox``)."""
    from ._config import outbox_settings

    settings, origins = outbox_settings(env)
    for keyword, var in origins.items():
        if keyword in overrides:
            continue
        try:
            validate_one(keyword, settings[keyword])
        except ConfigError as exc:
            raise ConfigError(f"{var}: {exc}") from None
    settings.update(overrides)
    return settings


def in_force(
    limits: Limits,
    settings: WorkerSettings,
    shutdown_timeout: float,
    dead_letter: str | None,
    dead_letter_max_bytes: int,
) -> dict[str, Any]:
    """The settings in force, by ``Outbox`` keyword (what ``outbox check`` prints)."""
    return {
        "max_events": limits.max_events,
        "max_bytes": limits.max_bytes,
        "policy": limits.policy.value,
        "block_timeout": limits.block_timeout,
        "max_batch_events": settings.max_batch_events,
        "max_batch_bytes": settings.max_batch_bytes,
        "linger": settings.linger,
        "max_concurrency": settings.max_concurrency,
        "send_timeout": settings.send_timeout,
        "shutdown_timeout": shutdown_timeout,
        "dead_letter": dead_letter,
        "dead_letter_max_bytes": dead_letter_max_bytes,
    }
