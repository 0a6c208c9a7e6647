"""The ``outbox`` commands' argument types: each refuses a value out of range at once, naming
it and what is accepted (argparse prints it with the argument's name and exits 2)."""

from __future__ import annotations

import argparse

__all__ = [
    "byte_count",
    "count",
    "fraction",
    "non_negative",
    "port",
    "positive_seconds",
    "run_count",
    "seconds_or_zero",
    "status",
]


def run_count(raw: str) -> int:
    """An argparse type: a whole number of runs, 1 or more."""
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of runs; give 1 or more")
    return value


def positive_seconds(raw: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of seconds, such as 5") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{raw} is not a number of seconds above 0, such as 5")
    return value


def seconds_or_zero(raw: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of seconds, such as 5") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{raw} is not a number of seconds, 0 or more, such as 5")
    return value


def port(raw: str) -> int:
    """An argparse type: a TCP port, 0 (a free one) to 65535."""
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port; give 0 (a free one) to 65535")
    return value


def fraction(raw: str) -> float:
    """An argparse type: a share from 0 to 1."""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a fraction; give 0 to 1, such as 0.5")
    return value


def status(raw: str) -> int:
    """An argparse type: an HTTP status code."""
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 100 <= value <= 599:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an HTTP status; give 100 to 599, such as 503")
    return value


def byte_count(raw: str) -> int:
    """An argparse type: a number of bytes, 1 or more."""
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of bytes; give 1 or more")
    return value


def count(raw: str) -> int:
    """An argparse type: a whole number, 1 or more (invocations, a buffer size)."""
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number of 1 or more")
    return value


def non_negative(raw: str) -> float:
    """An argparse type: a finite number, 0 or more (a rate, microseconds)."""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{raw!r} is not a finite number of 0 or more")
    return value
