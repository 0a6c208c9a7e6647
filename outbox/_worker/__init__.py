"""The worker: batching, retrying and shipping, in the sidecar.  It owns the intake, which takes
due batches from the buffer and serializes them in slices (``_intake``); what it holds of an
event and the one order key (``_held``); the backlog, one FIFO per order key with keys muted
while on the wire (``_keys``), and how answers are settled, isolation and poison included
(``_backlog``, ``_ledger``); the pure decisions: which lanes go now, when to wake, what an answer
means (``_dispatch``), how many lanes (``_lanes``), backoff, close pacing and the breaker
(``_retry``); one attempt at the transport, its answer classified (``_sender``); the conductor,
the loop that runs them (``_conductor``); the sidecar, the thread and loop (or the caller's
loop) the conductor runs in, with its close and stats (``_sidecar``); and a composite's members,
each with its own buffer and sidecar (``_fanout``).  It may import every part below it:
``outbox._buffer``, ``outbox._spill``, ``outbox.transports``, ``outbox._config``,
``outbox._runtime``, ``outbox._run``, ``outbox._observability``, ``outbox._errors``; only the
facade (``outbox._outbox``, ``outbox._setup``) imports from it."""
