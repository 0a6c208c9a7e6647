"""Fast OpenLineage serialization, run in the sidecar (never in ``emit``).

:func:`serialize` produces, for every openlineage-python event, the same JSON
object (after parsing) as ``openlineage.client.serde.Serde.to_json``, and accepts and
refuses the same values:

* attrs instances become objects with every field, then ``None`` values are
  removed from objects; ``None`` items and empty objects are removed from lists;
* enums become their ``value``; ``date``/``datetime`` their ``isoformat()`` (a datetime
  without a timezone too, with a warning: the spec's date-time needs an offset);
  ``UUID`` its string; tuples become lists, and so do sets inside an attrs object
  (``attr.asdict`` makes them lists).  In an event given as a dict, Serde has no place for a
  set (it writes a placeholder): :class:`Unserializable` here.

Where Serde would send something other than the event, :class:`Unserializable` says what,
where in the event, and the fix (the outbox drops the event as ``invalid_event``): a value
JSON cannot hold, where Serde writes the string ``"<<non-serializable: Name>>"`` in its
place; and a NaN or an infinity, where Serde writes the bare token ``NaN``/``Infinity``,
which is not JSON.  Keys JSON cannot write or Serde cannot sort, and an event that holds
itself, fail in Serde as here, with a plainer message here.  One leniency: an attrs object
inside an event given as a dict is written as it would be in an openlineage-python event
(Serde writes a placeholder for it).

It is faster because it walks each attrs class's fields through a cached
``operator.attrgetter`` in one pass (Serde makes two: ``attr.asdict`` and then
a filtering copy) and encodes with orjson.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from ._plain import Unserializable, dumps, event_key, plain_dict, to_plain
from ._refusals import too_deep
from ._run import DatasetRef, RunRecord, record_json
from ._runid import uuid_text

__all__ = [
    "Key",
    "SerializedEvent",
    "Unserializable",
    "dumps",
    "event_key",
    "order_key",
    "serialize",
    "to_plain",
]


class SerializedEvent(NamedTuple):
    """An event as the transports see it."""

    #: The event's JSON, UTF-8.
    body: bytes
    #: ``runId`` of a RunEvent, else None.  Events of one run share it.
    run_id: str | None
    #: The Kafka message key openlineage-python would use (``run:ns/name``, ...).
    key: str | None


_new_serialized = tuple.__new__  # SerializedEvent(...) without its Python-level __new__
_new_ref = tuple.__new__  # DatasetRef(...) likewise

#: What a run's order is kept by: a run id, a message key (a job's or a dataset's events, which
#: have no run), or, for an event that has neither, a number of its own (an int never equals a
#: str, so such an event is a key of its own).
Key = str | int


def order_key(event: SerializedEvent, own: int) -> Key:
    """The key an event's order is kept by, the one definition (the worker's backlog, HTTP's
    single mode): its run id, else its message key, else ``own``, a number no other event of
    the batch or backlog has (the worker's sequence number, a request's index)."""
    return event.run_id or event.key or own


def weight(ser: SerializedEvent) -> int:
    """The bytes a serialized event holds, as ``max_bytes`` counts them: its body, and its key
    (a string of its own: ``run:ns/name`` holds the job's name again, as large as the body
    when the name is).  The run id is not counted: its events share it."""
    key = ser.key
    return len(ser.body) + len(key) if key else len(ser.body)


# Run ids the run helpers gave as numbers, written as text lately: a run's START and COMPLETE
# (and its other events) share one string, written once (a handler thread's run's events come
# one after the other; a few threads' interleave).  Forgotten whole when full.
_RUN_TEXTS: dict[int, str] = {}
_RUN_TEXTS_MAX = 64


def serialize(event: Any) -> SerializedEvent:
    """Serialize one accepted event.

    Raises:
        ValueError: ``str``/``bytes`` input that is not a JSON object, or an
            object that cannot be encoded at all (:class:`Unserializable`, which says what
            and where).
    """
    cls = event.__class__
    if cls is tuple:  # a run helpers' record as an outbox's run queues it: what changes, plainly
        job, state, t, rid, inputs, outputs, error, name = event
        if name is not None:  # one dataset without facets: its namespace, and its name
            inputs = _new_ref(DatasetRef, (inputs, name, None))
        if rid.__class__ is not str:
            text = _RUN_TEXTS.get(rid)
            if text is None:
                text = uuid_text(rid)
                if len(_RUN_TEXTS) >= _RUN_TEXTS_MAX:
                    _RUN_TEXTS.clear()
                _RUN_TEXTS[rid] = text
            rid = text
        body = record_json(job, state, t, rid, inputs, outputs, error)
        return _new_serialized(SerializedEvent, (body, rid, job.key))
    if cls is RunRecord:  # the run helpers' events: the job's part is written once
        rid = event.run_id
        if isinstance(rid, int):
            text = _RUN_TEXTS.get(rid)
            if text is None:
                text = event.run_text()
                if len(_RUN_TEXTS) >= _RUN_TEXTS_MAX:
                    _RUN_TEXTS.clear()
                _RUN_TEXTS[rid] = text
            rid = text
        return _new_serialized(SerializedEvent, (event.to_json(rid), rid, event.job.key))
    if isinstance(event, (bytes, bytearray, memoryview, str)):
        body = event.encode() if isinstance(event, str) else bytes(event)
        try:
            plain = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"pre-serialized event is not valid JSON: {exc}") from exc
        if not isinstance(plain, dict):
            raise ValueError(f"pre-serialized event must be a JSON object, got {type(plain).__name__}")
    else:
        try:
            plain = plain_dict(event) if event.__class__ is dict else to_plain(event)
            if not isinstance(plain, dict):
                raise ValueError(f"event serialized to {type(plain).__name__}, not a JSON object")
            body = dumps(plain)
        except RecursionError:
            raise too_deep(event) from None
    run = plain.get("run")
    run_id = run.get("runId") if isinstance(run, dict) else None
    return SerializedEvent(body, run_id if isinstance(run_id, str) else None, event_key(plain))
