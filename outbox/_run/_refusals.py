"""Why an event cannot be written as JSON, in plain words: what, where in the event, what
openlineage-python's ``Serde`` does with it, and the fix.  The serializer (``_plain``) calls in
here only once it has met such a value, so its common path pays nothing for the words; the
walks below are the slow path, per refused event.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from .._observability._log import RateLimitedLog

__all__ = ["Found", "NonFinite", "Unserializable", "naive_datetime", "refusal", "too_deep"]

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_$@-]+")
# Bounds the walks that look for a cycle (a tree of shared parts is walked once per parent).
_MOST_VISITS = 100_000
_log = RateLimitedLog(30.0)


class Unserializable(ValueError):
    """An event holds a value JSON cannot hold; the message says what, where, and the fix."""


class NonFinite:
    """A NaN or an infinity, as the serializer's walk leaves it in the plain data: the encoder
    cannot write it (orjson would write ``null``, silently), so it is refused, by name."""

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value


class Found(Exception):
    """Raised by the encoder's ``default`` on a value JSON cannot hold (the value in hand)."""

    def __init__(self, value: Any) -> None:
        super().__init__(type(value).__qualname__)
        self.value = value


def _step(key: Any) -> str:
    if isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
        return f".{key}"
    return f"[{key!r}]"


def _at(path: str) -> str:
    return f"at {path.lstrip('.')}" if path else "at the top of the event"


def _walk(root: Any) -> Iterator[tuple[str, Any]]:
    """(path, value) of every value of plain data (dicts and lists), depth first."""
    stack: list[tuple[str, Any]] = [("", root)]
    while stack:
        path, value = stack.pop()
        yield path, value
        if value.__class__ is dict:
            stack.extend((path + _step(k), v) for k, v in reversed(list(value.items())))
        elif value.__class__ is list:
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))


def _find(root: Any, match: Callable[[Any], bool]) -> tuple[str, Any] | None:
    return next(((path, value) for path, value in _walk(root) if match(value)), None)


def _non_finite(value: float, path: str) -> Unserializable:
    name = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return Unserializable(
        f"{_a(name)} {name} {_at(path)}: JSON has no {name} (openlineage-python sends the bare "
        f"token {name}, which is not JSON either: a strict JSON parser refuses the event); "
        "leave the field out (None), or give a finite number"
    )


def _what(value: Any) -> tuple[str, str]:
    """(what the value is, what to do instead)."""
    if isinstance(value, (set, frozenset)):
        return "a set", "pass a list (sorted, for the same order every time)"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"a {type(value).__name__} value", "decode it to text"
    if isinstance(value, Decimal):
        return "a Decimal", "convert it to a float, or to text to keep every digit"
    name = type(value).__name__
    what = "an object()" if type(value) is object else f"{_a(name)} {name} object"
    return what, "convert it to text, a number, a bool, a list or a mapping"


def _a(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _keys_problem(value: Any) -> str | None:
    """What is wrong with the keys of ``value`` (a dict), for openlineage-python's
    ``json.dumps(sort_keys=True)``, or None."""
    if value.__class__ is not dict or all(k.__class__ is str for k in value):
        return None
    for key in value:
        if key is not None and not isinstance(key, (str, int, float)):
            return (
                f"a key of type {type(key).__name__}, {key!r}, which JSON cannot write: a JSON key "
                "is text (openlineage-python writes int, float, bool and None keys as text, and "
                "refuses others); make it a string"
            )
    try:
        sorted(value)
    except TypeError:
        kinds = ", ".join(sorted({type(k).__name__ for k in value}))
        return (
            f"keys of different types ({kinds}), which openlineage-python cannot sort (it writes "
            "an object's keys sorted, and refuses the event); make every key a string"
        )
    return None


def refusal(plain: Any, value: Any) -> Unserializable:
    """The error for ``plain``, which cannot be written: ``value`` is what the encoder could
    not write (found by identity), or None when the encoder said only that it failed (keys it
    cannot write or sort, a NaN)."""
    if value is not None:
        found = _find(plain, lambda v: v is value)
        path = found[0] if found is not None else None
        if isinstance(value, NonFinite):
            return _non_finite(value.value, path or "")
        what, fix = _what(value)
        name = type(value).__qualname__
        where = _at(path) if path is not None else "in the event"
        return Unserializable(
            f"{what} {where}, which JSON cannot hold (openlineage-python sends the text "
            f'"<<non-serializable: {name}>>" in its place); {fix}'
        )
    for path, node in _walk(plain):
        problem = _keys_problem(node)
        if problem is not None:
            return Unserializable(f"{_at(path)}: {problem}")
        if isinstance(node, float) and not math.isfinite(node):
            return _non_finite(node, path)
    return Unserializable("the event cannot be written as JSON")


def naive_datetime(value: Any) -> None:
    """Say (at a bounded rate) that a datetime without a timezone was written as it is."""
    _log.warning(
        "naive-datetime",
        "an event holds a datetime without a timezone (%s): written as it is, as openlineage-python "
        "writes it, with no UTC offset, which the OpenLineage spec's date-time format requires "
        "(RFC 3339): a backend may read it in a zone of its own, or refuse it; give an aware "
        "datetime, such as datetime.now(timezone.utc)",
        value.isoformat(),
    )


def _children(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [(_step(k), v) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    fields = getattr(type(value), "__attrs_attrs__", None)
    if fields is not None:
        return [(_step(f.name), getattr(value, f.name, None)) for f in fields]
    return []


def _cycle(root: Any) -> str | None:
    """The path at which ``root`` holds one of the values it is inside of, if it does.  Each
    value visited keeps its parent and its step, and the path is spelt only for the one found:
    a path string per value cost the square of the depth (23 s for an event 100,000 deep)."""
    inside: set[int] = set()
    steps: list[tuple[int, str]] = [(-1, "")]  # (the parent's index here, the step from it)
    stack: list[tuple[Any, int, bool]] = [(root, 0, False)]
    visits = 0
    while stack and visits < _MOST_VISITS:
        value, node, leaving = stack.pop()
        if leaving:
            inside.discard(id(value))
            continue
        visits += 1
        if id(value) in inside:
            path = []
            while node > 0:
                node, step = steps[node]
                path.append(step)
            return "".join(reversed(path))
        children = _children(value)
        if children:
            inside.add(id(value))
            stack.append((value, node, True))
            for step, child in reversed(children):
                steps.append((node, step))
                stack.append((child, len(steps) - 1, False))
    return None


def too_deep(event: Any) -> Unserializable:
    """The error for an event the serializer's recursion could not get through."""
    path = _cycle(event)
    if path is not None:
        return Unserializable(
            f"the event holds itself {_at(path)} (a reference cycle), which JSON cannot write "
            "(nor can openlineage-python); break the cycle"
        )
    return Unserializable(
        "the event is nested too deeply to write (deeper than Python's recursion limit, which "
        "openlineage-python reaches too); flatten it"
    )
