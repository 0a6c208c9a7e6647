"""JSON-ready values from openlineage-python events and facets (no I/O, no outbox state):
:func:`to_plain` walks attrs classes, enums, dates and UUIDs the way
``openlineage.client.serde.Serde`` does (``attr.asdict``, then its own pass), :func:`plain_dict`
walks an event given as a dict as Serde walks a dict (no ``attr.asdict``: a set stays a set,
which JSON cannot hold), :func:`dumps` encodes the result and refuses what is not JSON (a NaN
too: the walks mark one), in plain words (``_refusals``), and :func:`event_key` names the Kafka
message key openlineage-python gives an event.  Shared by the serializer (``_serde``) and the
run helpers (``_run``), which must not import each other.
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

from . import _refusals
from ._refusals import NonFinite, Unserializable

__all__ = ["Unserializable", "dumps", "event_key", "plain_dict", "to_plain"]

_Converter = Callable[[Any], dict[str, Any]]
# attrs class -> its generated converter; None for classes that are not attrs classes.
_CONVERTERS: dict[type, _Converter | None] = {}
# Written as they are.  A float is not among them: it is checked, once, for a NaN or an
# infinity (not JSON), which orjson would write as null without a word.
_SCALARS = frozenset({str, int, bool})
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
    # A float field goes through to_plain (its check costs that call); not checked inline here,
    # which would cost every other field that is not a scalar a test (attrs fields hold floats
    # rarely; facet dicts, checked inline, more often).
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
                if value.__class__ is float:  # checked inline: through a call, nearly 4x the cost
                    out[key] = value if value - value == 0.0 else NonFinite(value)
                    continue
                value = to_plain(value)
                if value is not None:
                    out[key] = value
        return out
    if cls is list:
        return _plain_list(obj)
    if cls is float:
        return obj if obj - obj == 0.0 else NonFinite(obj)  # inf - inf is a NaN too
    converter = _converter_for(cls)
    if converter is not None:
        return converter(obj)
    return _plain_other(obj)


def _plain_list(items: Any) -> list[Any]:
    out = []
    for item in items:
        if item is not None:
            if item.__class__ is float:
                out.append(item if item - item == 0.0 else NonFinite(item))
                continue
            item = to_plain(item)
            if item is not None and not (item.__class__ is dict and not item):
                out.append(item)
    return out


def _plain_other(obj: Any) -> Any:
    # Same order of checks as Serde.remove_nulls_and_enums.
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, datetime.date):
        if isinstance(obj, datetime.datetime) and obj.utcoffset() is None:
            _refusals.naive_datetime(obj)  # written as Serde writes it, with a word
        return obj.isoformat()
    if isinstance(obj, uuid.UUID):
        return str(obj)
    if isinstance(obj, dict):
        return to_plain(dict(obj))
    if isinstance(obj, (list, tuple, set, frozenset)):
        return _plain_list(obj)
    if obj.__class__.__name__ == "int64":  # numpy/pandas integers, as Serde does
        return int(obj)
    if isinstance(obj, float):  # a subclass (numpy's float64): as a float, checked
        return to_plain(float(obj))
    return obj  # str/int subclasses are encoded natively; the rest refused by _default


def plain_dict(event: dict[Any, Any]) -> dict[Any, Any]:
    """An event given as a dict, walked as ``Serde.to_dict`` walks a dict: no ``attr.asdict``
    first, so a set (or frozenset) is left as it is, for :func:`dumps` to refuse (Serde sends
    ``"<<non-serializable: set>>"`` in its place).  An attrs object in it is converted as
    :func:`to_plain` converts it (Serde would send a placeholder for it: lineage the caller
    meant, not a loss), sets within it as lists, as ``attr.asdict`` makes them.  Same work
    per value as :func:`to_plain`."""
    out: dict[Any, Any] = {}
    for key, value in event.items():
        if value.__class__ in _SCALARS:
            out[key] = value
        elif value is not None:
            if value.__class__ is float:
                out[key] = value if value - value == 0.0 else NonFinite(value)
                continue
            value = _dict_value(value)
            if value is not None:
                out[key] = value
    return out


def _dict_value(obj: Any) -> Any:
    cls = obj.__class__
    if cls is float:
        return obj if obj - obj == 0.0 else NonFinite(obj)
    if cls is dict:
        return plain_dict(obj)
    if cls is list:
        out = []
        for item in obj:
            if item is not None:
                item = item if item.__class__ in _SCALARS else _dict_value(item)
                if item is not None and not (item.__class__ is dict and not item):
                    out.append(item)
        return out
    if isinstance(obj, (set, frozenset)):
        return obj  # JSON has no sets: dumps refuses it, where Serde writes a placeholder
    if isinstance(obj, dict):  # subclasses, as Serde's isinstance checks
        return plain_dict(dict(obj))
    if isinstance(obj, list):
        return _dict_value(list(obj))
    return to_plain(obj)  # an attrs object, an enum, a date, a UUID, a tuple...


def _default(obj: Any) -> Any:
    # Serde writes "<<non-serializable: Name>>" in its place: lineage that silently says
    # something else than what was emitted; and a NaN (a NonFinite here) as NaN, which is
    # not JSON.  The outbox drops the event as invalid_event.
    raise _refusals.Found(obj)


def dumps(plain: Any) -> bytes:
    """Encode plain data (from :func:`to_plain` or :func:`plain_dict`); falls back to the
    stdlib for what orjson refuses (non-string keys, integers beyond 64 bits) so the output
    still matches Serde.

    Raises:
        Unserializable: a value JSON cannot hold (what, and where in the event): an object of
            no JSON type, a set, keys JSON cannot write, a NaN or an infinity.
    """
    try:
        return orjson.dumps(plain, default=_default, option=_ORJSON_OPTIONS)
    except (orjson.JSONEncodeError, TypeError) as exc:
        if isinstance(exc.__cause__, _refusals.Found):
            raise _refusals.refusal(plain, exc.__cause__.value) from None
    try:
        return json.dumps(plain, sort_keys=True, default=_default, allow_nan=False).encode()
    except _refusals.Found as found:
        raise _refusals.refusal(plain, found.value) from None
    except (TypeError, ValueError):  # keys it cannot write or sort
        raise _refusals.refusal(plain, None) from None


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
