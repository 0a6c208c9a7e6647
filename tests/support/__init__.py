"""What the tests share: scripted transports and waits (helpers), Kafka topics read back
(kafka_helpers), the randomized chaos runs (chaos, spill_chaos), the OpenLineage schemas (spec),
openlineage-python transports for the adapter (ol_transports), the dead-letter file's records and
``outbox replay`` as an operator runs it (dead_letters), where the repository and the tests are
(paths), and the one place the tests look inside an outbox (parts)."""
