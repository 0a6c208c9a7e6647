"""What ``emit`` takes: the :data:`Event` type (so mypy refuses ``outbox.emit(Foo())``), and how
an event is admitted (an O(1) class check on the hot path) and sized for the buffer's bound."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, TypeAlias, Union

from ._buffer import Buffer
from ._run import RunRecord
from ._serde import serialize

if TYPE_CHECKING:
    from openlineage.client import event_v2
    from openlineage.client import run as legacy

#: An OpenLineage event as :meth:`Outbox.emit` accepts it: an openlineage-python event
#: (``event_v2`` ``RunEvent``/``DatasetEvent``/``JobEvent``, or the legacy ``run`` classes), a
#: dict, or the event's JSON as ``str`` or ``bytes``.
Event: TypeAlias = Union[  # the openlineage names are strings: imported for type checkers only
    "event_v2.BaseEvent",
    "legacy.RunEvent",
    "legacy.DatasetEvent",
    "legacy.JobEvent",
    dict[str, Any],
    str,
    bytes,
    bytearray,
]


# Classes emit() has already accepted, for an O(1) check on the hot path.
EVENT_CLASSES: set[type] = {dict, RunRecord}
# Classes sized by their length (str, bytes and their subclasses, once seen).
TEXT_CLASSES: set[type] = {str, bytes, bytearray}
_event_bases: tuple[type, ...] | None = None


def _openlineage_event_bases() -> tuple[type, ...]:
    global _event_bases
    if _event_bases is None:
        from openlineage.client import event_v2

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from openlineage.client import run as legacy

        _event_bases = (event_v2.BaseEvent, legacy.RunEvent, legacy.DatasetEvent, legacy.JobEvent)
    return _event_bases


def admit(event: Any) -> None:
    """The slow path of emit's type check: accept and remember the class, or raise."""
    cls = event.__class__
    if isinstance(event, (str, bytes, bytearray)):
        TEXT_CLASSES.add(cls)  # sized by its length, as str and bytes are
        return
    if isinstance(event, (dict, _openlineage_event_bases())):
        EVENT_CLASSES.add(cls)
        return
    raise TypeError(
        f"emit() takes an OpenLineage event (an openlineage-python RunEvent, DatasetEvent or JobEvent, "
        f"a dict, or JSON as str/bytes), not {cls.__module__}.{cls.__qualname__}"
    )


def sized(buf: Buffer, event: Any) -> tuple[Any, int]:
    """The event as it will be queued, and the bytes it counts for: what ``emit`` does inline
    on its hot path, for ``emit_async``.

    Raises:
        TypeError: ``event`` is not an event at all.
    """
    cls = event.__class__
    if cls in TEXT_CLASSES:
        return event, len(event)
    if cls not in EVENT_CLASSES:
        admit(event)
        if cls in TEXT_CLASSES:
            return event, len(event)
    if not buf.measured or (not buf.emitted & (SAMPLE_EVERY - 1) and len(buf.queue) > buf.sample_above):
        return measure(buf, event)
    return event, buf.estimate


# While the sidecar is behind, emit measures one object event in this many (a power of two).
SAMPLE_EVERY = 128


def measure(buf: Buffer, event: Any) -> tuple[Any, int]:
    """Serialize an object event in ``emit``: the first one, and a sample while the sidecar
    is behind.

    Objects are counted by a running estimate that the sidecar learns by serializing them.
    Before it has measured one, the estimate is a guess, and a burst emitted while the
    sidecar's thread is still starting (its HTTP client loads certificates: tens of
    milliseconds) was held at that guess: 100 KB dicts grew the process by up to 358 MiB with
    ``max_bytes`` 64 MiB.  Later, when events grow (small ones, then large), a sidecar that
    is behind learns it late: 272 MiB.  Serializing the first event here, and one in
    ``SAMPLE_EVERY`` while more than a batch waits, bounds what is held at a short estimate;
    the serialized event is queued as such (no work is done twice).  An event that cannot
    be serialized is left for the worker to count."""
    try:
        ser = serialize(event)
    except Exception:
        return event, buf.estimate
    size = len(ser.body)
    with buf.lock:
        buf.learn_locked(size)
    return ser, size
