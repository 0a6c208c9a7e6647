"""lineage-outbox: emit OpenLineage events without waiting on, or failing because of,
the lineage backend.

    from outbox import Outbox

    outbox = Outbox.from_env()        # OPENLINEAGE_URL, OPENLINEAGE__TRANSPORT__*, OUTBOX_*
    outbox.emit(run_event)            # microseconds; never raises for backend trouble
    report = outbox.close(timeout=5)  # delivers what it can by the deadline
"""

from ._bridge import OutboxTransport
from ._buffer import Policy, Reason
from ._errors import ConfigError, OutboxError
from ._event import Event
from ._outbox import Outbox
from ._run import DatasetRef, LineageJob, Run, current_run_id, s3_dataset, trino_dataset
from ._stats import CloseReport, Stats
from .transports._base import About, Outcome, OutcomeKind, SerializedEvent, Transport

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

# Show the public names in reprs and docs, as httpx does.
for _name in __all__:
    if isinstance(globals()[_name], type) or callable(globals()[_name]):
        globals()[_name].__module__ = "outbox"
del _name
