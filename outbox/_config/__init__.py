"""Configuration: what the outbox is told, checked once, at construction.  It owns
``Outbox.from_env``'s reading of openlineage-python's rules (``OPENLINEAGE_*``, the YAML file)
and of the ``OUTBOX_*`` variables, with the helpers the transports share to read their
configuration (``_config``), and the settings: the buffer's limits, the worker's keywords
(``WorkerSettings``) and the checks every value goes through, so that bad input fails named
(``_settings``).  It may import ``outbox._buffer`` (the policies), ``outbox._observability``
and ``outbox._errors``; the transports and the worker import from it, never the reverse.  How
an outbox's parts are built from the settings is the facade's (``outbox._setup``), which sits
above every part."""
