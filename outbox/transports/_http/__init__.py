"""HTTP's private parts, behind ``outbox.transports.http.HttpTransport``: its arguments checked,
credentials, headers, TLS and the httpx client (``_settings``); openlineage-python's ``http``
and ``async_http`` configuration as keyword arguments (``_config``); what an answer means:
Retry-After, ``partial_success``, a status's verdict (``_answers``); single mode, one event per
request with each key's events in order (``_single``); and the dataset names released DataHub
cannot hold (``_datahub``).  It may import ``outbox.transports._base``, ``outbox._config``,
``outbox._observability`` and ``outbox._errors``; the adapter for openlineage-python's own
transports borrows its secret redaction."""
