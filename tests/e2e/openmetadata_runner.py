"""Runs in the connector's own virtual environment (see openmetadata.py): OpenMetadata's
ingestion workflow, its OpenLineage source and REST sink unpatched, on the config read from
standard input; prints its status as one JSON line."""

import json
import sys

from metadata.workflow.metadata import MetadataWorkflow

workflow = MetadataWorkflow.create(json.loads(sys.stdin.read()))
workflow.execute()
source = workflow.source.get_status()
sink = workflow.steps[-1].get_status() if workflow.steps else None
print(
    json.dumps(
        {
            "source_records": len(source.records),
            "source_failures": [str(f) for f in source.failures],
            "source_warnings": [str(w) for w in source.warnings],
            "sink_records": len(sink.records) if sink else 0,
            "sink_failures": [str(f) for f in sink.failures] if sink else [],
        }
    )
)
workflow.stop()
