"""The ``outbox`` command's tools: a local lineage backend (``sink``), a Kafka-to-HTTP
forwarder (``forward``), ``check``, ``replay``, ``bench`` and the benchmarks, a fault proxy and
an embedded Kafka-protocol broker for tests.

None of this is the library's API (that is ``outbox`` itself); the tools use it as any
application would.
"""
