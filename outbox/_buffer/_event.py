"""What ``emit`` takes: the :data:`Event` type (so mypy refuses ``outbox.emit(Foo())``), and how
an event is admitted (an O(1) class check on the hot path) and sized for the buffer's bound
(text by its length; an object at the estimate the sidecar learns: never serialized here)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeAlias, Union

from .._run._run import RunRecord

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


def _openlineage_event_bases() -> tuple[type, ...]:
    """openlineage-python's event classes, from its modules already imported: an object can
    be an instance of one only once its module is, so nothing is imported here (importing
    ``openlineage.client`` takes about 300 ms: never inside ``emit``)."""
    bases: list[type] = []
    v2 = sys.modules.get("openlineage.client.event_v2")
    if v2 is not None:
        bases.append(v2.BaseEvent)
    legacy = sys.modules.get("openlineage.client.run")
    if legacy is not None:
        bases += (legacy.RunEvent, legacy.DatasetEvent, legacy.JobEvent)
    return tuple(bases)


def admit(event: Any) -> None:
    """The slow path of emit's type check (once per class): accept and remember the class,
    or raise."""
    cls = event.__class__
    if isinstance(event, (str, bytes, bytearray)):
        TEXT_CLASSES.add(cls)  # sized by its length, as str and bytes are
        return
    if isinstance(event, (dict, *_openlineage_event_bases())):
        EVENT_CLASSES.add(cls)
        return
    raise TypeError(
        f"emit() takes an OpenLineage event (an openlineage-python RunEvent, DatasetEvent or JobEvent, "
        f"a dict, or JSON as str/bytes), not {cls.__module__}.{cls.__qualname__}"
    )


def sized(event: Any) -> tuple[Any, int]:
    """The bytes an event counts for, as ``emit`` computes them inline on its hot path (for
    ``emit_async``): text by its length, an object 0 (counted at the estimate the sidecar
    learns; nothing is serialized here).

    Raises:
        TypeError: ``event`` is not an event at all.
    """
    cls = event.__class__
    if cls in TEXT_CLASSES:
        return event, len(event) or 1
    if cls not in EVENT_CLASSES:
        admit(event)
        if cls in TEXT_CLASSES:
            return event, len(event) or 1
    return event, 0
