"""The spill: every accepted event kept on local disk until its fate is known, so that a
process that dies (SIGKILL, an OOM kill, a container replaced) or closes with the backend down
hands what it had not delivered to its successor.  Off unless ``spill_dir`` is set.

It is a log, as Kafka's, Vector's disk buffer and a database's write-ahead log are: each owner
(an outbox's process) appends *event* records and *settlement* records (ranges of sequence
numbers delivered, or lost with their reason) to segments in a directory of its own; numbers
are never reused, so recovery is a replay (events minus settlements), whatever crashed when.
A successor adopts a dead owner by moving its directory into its own (one atomic rename), reads
its files in place and hands their live events on, in order, before its own newer ones.

One door: :class:`Spill` (for the outbox's parts), :func:`inspect_dir` (for ``outbox check``)
and the defaults.  Inside: ``_format`` (records, bytes, reading a file back), ``_ranges`` (sets
of numbers), ``_streams`` (what is live, replay, checkpoints, reading runs back), ``_owners``
(directories, locks, adoption, inspection), ``_disk`` (this owner's writes and settlements),
``_window`` (the buffer's overflow, in memory and on disk), ``_spill`` (the whole, driven by the
sidecar).  It imports the buffer (whose ``Overflow`` protocol the window is), the serializer, the
slicer and the log, nothing else of the outbox.
"""

from ._owners import inspect_dir
from ._spill import DEFAULT_INTERVAL, DEFAULT_MAX_BYTES, Spill

__all__ = ["DEFAULT_INTERVAL", "DEFAULT_MAX_BYTES", "Spill", "inspect_dir"]
