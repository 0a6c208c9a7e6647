"""The runtime: how the library lives in a process beside the application.  It owns the
outbox's own threads, with signals blocked and never joined at exit (``_threads``), the slices
the sidecar's per-event work is cut into so that the GIL goes back to the handlers between two
(``_slices``), the process hooks: exit, fork (a child gets a fresh runtime) and a
multiprocessing child's end, holding each outbox's methods weakly (``_lifecycle``), and
``close_on_signal``, a handler that never waits (``_signals``).  The sidecar that runs the
worker is the worker's (``outbox._worker._sidecar``): the transports, the spill and the worker
use these pieces, so they sit below all three.  It may import ``outbox._buffer`` (a slicer
reads whether handlers emit), ``outbox._observability`` and ``outbox._errors``."""
