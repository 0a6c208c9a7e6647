"""OpenMetadata's own OpenLineage connector (openmetadata-ingestion 2.0.7.0, unpatched), fed
the records the function's Kafka transport wrote to Apache Kafka, its server faked as a
catalogue of tables: the table -> table edge it draws, and the ones it does not."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from e2e.openmetadata import FakeOpenMetadata, run_connector

from support.kafka_helpers import create_topic, produce, read_topic

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TRINO = "trino://vast-trino:8080"


def table(bucket: str, kind: str) -> str:
    """The fully qualified name OpenMetadata's Trino service gives the table."""
    return f"trino.vast.lineage.{bucket}_{kind}"


def old_failing_run(bucket: str) -> list[bytes]:
    """A run that fails, as the run helpers sent it before outputs went on COMPLETE only: the
    output on START and FAIL (the control that shows the connector would draw that edge)."""
    run_id = str(uuid.uuid4())
    source = {
        "namespace": f"s3://{bucket}",
        "name": "lineage-src/orders.bad",
        "facets": {
            "symlinks": {
                "_producer": "p",
                "_schemaURL": "https://openlineage.io/spec/facets/1-0-1/SymlinksDatasetFacet.json",
                "identifiers": [{"namespace": TRINO, "name": f"vast.lineage.{bucket}_raw", "type": "TABLE"}],
            }
        },
    }
    events = []
    for state in ("START", "FAIL"):
        events.append(
            orjson.dumps(
                {
                    "eventType": state,
                    "eventTime": "2026-12-02T10:00:00+00:00",
                    "run": {"runId": run_id, "facets": {}},
                    "job": {"namespace": "vast-dataengine://my-tenant", "name": "lineage-demo.oldfn"},
                    "inputs": [source],
                    "outputs": [{"namespace": TRINO, "name": f"vast.lineage.{bucket}_orders"}],
                    "producer": "https://example.com/lineage-demo",
                    "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
                }
            )
        )
    return events


def test_openmetadatas_connector_draws_the_table_edge_of_the_successful_run_only(apache_kafka):
    topic = f"e2e-openmetadata-{uuid.uuid4().hex[:8]}"
    create_topic(apache_kafka.bootstrap_servers, topic, partitions=1)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_", "LINEAGE_"))},
        "OPENLINEAGE__TRANSPORT__TYPE": "kafka",
        "OPENLINEAGE__TRANSPORT__TOPIC": topic,
        "OPENLINEAGE__TRANSPORT__CONFIG": orjson.dumps(
            {"bootstrap.servers": apache_kafka.bootstrap_servers, "acks": "all"}
        ).decode(),
        "LINEAGE_INPUT_TABLE": f"{TRINO}/vast.lineage.{{bucket}}_raw",
        "LINEAGE_OUTPUTS": f"{TRINO}/vast.lineage.{{bucket}}_orders",
    }
    # The function as the platform runs it: one object that succeeds, one (another bucket, so
    # other tables) that fails on purpose.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "function",
            "docs-src/lineage-src/orders.csv",
            "docs-bad/lineage-src/orders.bad",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "delivered 4, lost none" in result.stdout
    produce(apache_kafka.bootstrap_servers, topic, old_failing_run("docs-old"))
    records = read_topic(apache_kafka.bootstrap_servers, topic, 6, timeout=30)
    assert len(records) == 6

    tables = [
        table(bucket, kind) for bucket in ("docs-src", "docs-bad", "docs-old") for kind in ("raw", "orders")
    ]
    with FakeOpenMetadata(tables) as server:
        status = run_connector(server.url, apache_kafka.bootstrap_servers, topic, ["trino"])
        edges = dict(server.edges)
        unknown = list(server.unknown)
    assert unknown == [], unknown  # every request the workflow made, the fake knows
    assert status["source_failures"] == [], status
    assert status["sink_failures"] == [], status
    table_edges = {(a, b) for a, b in edges if a in tables and b in tables}
    assert table_edges == {
        (table("docs-src", "raw"), table("docs-src", "orders")),  # the successful run's COMPLETE
        (table("docs-old", "raw"), table("docs-old", "orders")),  # the control: outputs on START
    }, edges
    # The function's failing run draws no edge to its output, nor a table -> table edge: only its
    # START, whose input resolves to a table, is drawn to the pipeline (OpenMetadata drops FAIL).
    assert not [key for key in edges if key[1] == table("docs-bad", "orders")], edges
    from_bad = [to for source, to in edges if source == table("docs-bad", "raw")]
    assert from_bad == ['vast_openlineage."vast-dataengine://my-tenant-lineage-demo.lineagefn"'], edges
    details = edges[(table("docs-src", "raw"), table("docs-src", "orders"))]["lineageDetails"]
    assert details["source"] == "OpenLineage"
    assert details["pipeline"]["type"] == "pipeline"  # the function's job, as the edge's pipeline
