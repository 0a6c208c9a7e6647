"""What the tests share: scripted transports and waits (helpers), Kafka topics read back
(kafka_helpers), the randomized chaos run (chaos), the OpenLineage schemas (spec), and
openlineage-python transports for the adapter (ol_transports)."""
