"""lineage-outbox: emit OpenLineage events without waiting on, or failing because of,
the lineage backend.

    from outbox import Outbox

    outbox = Outbox.from_env()        # OPENLINEAGE_URL, OPENLINEAGE__TRANSPORT__*, OUTBOX_*
    outbox.emit(run_event)            # microseconds; never raises for backend trouble
    report = outbox.close(timeout=5)  # delivers what it can by the deadline
"""

import typing as _typing

from ._buffer._buffer import Policy, Reason
from ._buffer._event import Event
from ._errors import ConfigError, OutboxError
from ._observability._stats import CloseReport, Stats
from ._outbox import Outbox
from ._run._run import DatasetRef, LineageJob, Run, current_run_id, s3_dataset, trino_dataset
from .transports._base import About, Outcome, OutcomeKind, SerializedEvent, Transport

if _typing.TYPE_CHECKING:
    from ._bridge import OutboxTransport

__all__ = [
    "About",
    "CloseReport",
    "ConfigError",
    "DatasetRef",
    "Event",
    "LineageJob",
    "Outbox",
    "OutboxError",
    "OutboxTransport",
    "Outcome",
    "OutcomeKind",
    "Policy",
    "Reason",
    "Run",
    "SerializedEvent",
    "Stats",
    "Transport",
    "current_run_id",
    "s3_dataset",
    "trino_dataset",
]

__version__ = "0.1.0"

# Imported on first use: it subclasses openlineage-python's Transport, and importing
# openlineage.client costs about 300 ms, most of what ``import outbox`` would take.
_LAZY = {"OutboxTransport"}


def _public(obj: _typing.Any) -> _typing.Any:
    """Show a public name in reprs and docs, as httpx does."""
    if isinstance(obj, type) or callable(obj):
        obj.__module__ = "outbox"
    return obj


for _name in __all__:
    if _name not in _LAZY:
        _public(globals()[_name])
del _name


def __getattr__(name: str) -> _typing.Any:
    if name == "OutboxTransport":
        from ._bridge import OutboxTransport

        globals()[name] = _public(OutboxTransport)  # later lookups find it without this hook
        return OutboxTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
