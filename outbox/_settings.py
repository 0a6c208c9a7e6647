"""The outbox's settings: the buffer's limits, and the checks every keyword (and the
``OUTBOX_*`` variable behind it) goes through, so bad input fails at construction, named."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._buffer import Policy
from ._errors import ConfigError

__all__ = ["Limits", "check_number", "validate_one"]


@dataclass(frozen=True, slots=True)
class Limits:
    max_events: int
    max_bytes: int
    policy: Policy
    block_timeout: float


def check_number(name: str, value: Any, *, minimum: float, integer: bool = False, above: bool = False) -> Any:
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        raise ConfigError(f"{name}={value!r} is not {kind}; pass {kind} {'>' if above else '>='} {minimum}")
    if value < minimum or (above and value == minimum):
        raise ConfigError(f"{name}={value!r} is out of range; pass {kind} {'>' if above else '>='} {minimum}")
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
    }
    if keyword in integers:
        check_number(keyword, value, minimum=1, integer=True)
    elif keyword == "send_timeout":
        check_number(keyword, value, minimum=0, above=True)
    elif keyword not in ("name", "close_at_exit", "dead_letter"):
        check_number(keyword, value, minimum=0)
