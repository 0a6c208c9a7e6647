"""The run helpers and serialization: what turns a handler's work into OpenLineage JSON.  It
owns ``LineageJob`` and ``Run`` (START, then COMPLETE or FAIL, as plain tuples the sidecar
serializes) and the run record (``_run``), run ids from the trace or UUIDv7 (``_runid``), the S3
and Trino dataset names (``_naming``), and the serializer: ``serialize`` and ``SerializedEvent``
(``_serde``), the walk to plain JSON values and openlineage-python's message keys (``_plain``),
and why a value is not JSON, in plain words (``_refusals``).  It may import
``outbox._observability`` and ``outbox._errors``; nothing above it (the buffer, the worker, the
spill) imports into it."""
