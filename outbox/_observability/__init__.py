"""Observability: what the outbox tells about itself.  It owns the ``outbox`` logger and its
rate limits and last-resort stderr line (``_log``), the ``Stats`` and ``CloseReport`` snapshots
(``_stats``), the OpenTelemetry instruments (``_metrics``) and the dead-letter file, where lost
events are kept with their reason (``_deadletter``).  It sits at the bottom of the library: it
may import ``outbox._errors`` and nothing else of the library at run time (the metrics read a
buffer and a spill they are handed, named for the type checker only)."""
