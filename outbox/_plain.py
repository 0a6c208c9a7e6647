"""JSON-ready values from openlineage-python events and facets (no I/O, no outbox state):
:func:`to_plain` walks attrs classes, enums, dates and UUIDs the way
``openlineage.client.serde.Serde`` does, :func:`dumps` encodes the result, and
:func:`event_key` names the Kafka message key openlineage-python gives an event.  Shared by the
serializer (``_serde``) and the run helpers (``_run``), which must not import each other.
"""

from __future__ import annotations

import datetime
import enum
import json
import keyword
import uuid
from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["Unserializable", "dumps", "event_key", "to_plain"]

_Converter = Callable[[Any], dict[str, Any]]
# attrs class -> its generated converter; None for classes that are not attrs classes.
_CONVERTERS: dict[type, _Converter | None] = {}
_SCALARS = frozenset({str, int, bool, float})
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def _converter_for(cls: type) -> _Converter | None:
    """Generate (once per class) a function that turns an instance into a dict, one
    straight-line block per field: about twice as fast as a loop over the fields.
    attrs and dataclasses generate their ``__init__`` the same way."""
    try:
        return _CONVERTERS[cls]
    except KeyError:
        pass
    attrs = getattr(cls, "__attrs_attrs__", None)
    if attrs is None:
        _CONVERTERS[cls] = None  # remember "not attrs": getattr on enum classes is slow
        return None
    lines = ["def convert(obj):", "    out = {}"]
    for a in attrs:
        name = a.name
        read = (
            f"obj.{name}"
            if name.isidentifier() and not keyword.iskeyword(name)
            else f"getattr(obj, {name!r})"
        )
        lines += [
            f"    v = {read}",
            "    if v.__class__ in scalars:",
            f"        out[{name!r}] = v",
            "    elif v is not None:",
            "        v = to_plain(v)",
            "        if v is not None:",
            f"            out[{name!r}] = v",
        ]
    lines.append("    return out")
    namespace: dict[str, Any] = {"scalars": _SCALARS, "to_plain": to_plain}
    exec("\n".join(lines), namespace)
    converter: _Converter = namespace["convert"]
    _CONVERTERS[cls] = converter
    return converter


def to_plain(obj: Any) -> Any:
    """Convert an event (attrs tree, dict, ...) into plain JSON-able Python data."""
    cls = obj.__class__
    if cls in _SCALARS:
        return obj
    converter = _CONVERTERS.get(cls)
    if converter is not None:
        return converter(obj)
    if cls is dict:
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            if value.__class__ in _SCALARS:
                out[key] = value
            elif value is not None:
                value = to_plain(value)
                if value is not None:
                    out[key] = value
        return out
    if cls is list:
        return _plain_list(obj)
    converter = _converter_for(cls)
    if converter is not None:
        return converter(obj)
    return _plain_other(obj)


def _plain_list(items: Any) -> list[Any]:
    out = []
    for item in items:
        if item is not None:
            item = to_plain(item)
            if item is not None and not (item.__class__ is dict and not item):
                out.append(item)
    return out


def _plain_other(obj: Any) -> Any:
    # Same order of checks as Serde.remove_nulls_and_enums.
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, datetime.date):
        return obj.isoformat()
    if isinstance(obj, uuid.UUID):
        return str(obj)
    if isinstance(obj, dict):
        return to_plain(dict(obj))
    if isinstance(obj, (list, tuple, set, frozenset)):
        return _plain_list(obj)
    if obj.__class__.__name__ == "int64":  # numpy/pandas integers, as Serde does
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    return obj  # str/int subclasses are encoded natively; the rest by _placeholder


class Unserializable(ValueError):
    """An event holds a value JSON cannot hold."""


def _default(obj: Any) -> Any:
    if isinstance(obj, float):
        return float(obj)
    # Serde writes "<<non-serializable: Name>>" in its place: lineage that silently says
    # something else than what was emitted.  The outbox drops the event as invalid_event.
    raise Unserializable(f"the event holds a {type(obj).__qualname__}, which JSON cannot hold")


def dumps(plain: Any) -> bytes:
    """Encode plain data; falls back to the stdlib for what orjson refuses
    (non-string keys, integers beyond 64 bits) so the output still matches Serde."""
    try:
        return orjson.dumps(plain, default=_default, option=_ORJSON_OPTIONS)
    except (orjson.JSONEncodeError, TypeError) as exc:
        if isinstance(exc.__cause__, Unserializable):
            raise exc.__cause__ from None
        return json.dumps(plain, sort_keys=True, default=_default).encode()


def _ns_name(obj: Any) -> tuple[Any, Any]:
    if isinstance(obj, dict):
        return obj.get("namespace"), obj.get("name")
    return None, None


def event_key(plain: dict[str, Any]) -> str | None:
    """The message key openlineage-python's Kafka transport gives this event.

    RunEvent: ``run:{ns}/{name}`` of the parent's root job, else the parent job,
    else the event's own job.  JobEvent: ``job:{ns}/{name}``.  DatasetEvent:
    ``dataset:{ns}/{name}``.
    """
    if "dataset" in plain and "job" not in plain:
        ns, name = _ns_name(plain["dataset"])
        return f"dataset:{ns}/{name}"
    job_ns, job_name = _ns_name(plain.get("job"))
    if "run" not in plain:
        return f"job:{job_ns}/{job_name}" if "job" in plain else None
    run = plain["run"]
    facets = run.get("facets") if isinstance(run, dict) else None
    parent = facets.get("parent") if isinstance(facets, dict) else None
    if isinstance(parent, dict) and parent:
        root = parent.get("root")
        if isinstance(root, dict) and root:
            ns, name = _ns_name(root.get("job"))
        else:
            ns, name = _ns_name(parent.get("job"))
        if ns and name:
            return f"run:{ns}/{name}"
    return f"run:{job_ns}/{job_name}"
