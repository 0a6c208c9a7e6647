"""The spill: every accepted event kept on local disk until its fate is known, so that a
process that dies, or closes with the backend down, hands what it had not delivered to its
successor.  Off unless ``spill_dir`` is set.  A log of event and settlement records, recovered
by replay: docs/architecture.md ("The spill: a log") draws it and lists the modules.

One door: :class:`Spill` (for the outbox's parts), :func:`inspect_dir` (for ``outbox check``)
and the defaults.  It imports the buffer (whose ``Overflow`` protocol the window is), the
serializer, the slicer and the log, nothing else of the outbox.
"""

from ._owners import inspect_dir
from ._spill import DEFAULT_INTERVAL, DEFAULT_MAX_BYTES, Spill

__all__ = ["DEFAULT_INTERVAL", "DEFAULT_MAX_BYTES", "Spill", "inspect_dir"]
