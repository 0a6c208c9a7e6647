"""A handler written the way the platform's documentation writes it: openlineage-python's
OpenLineageClient() with no arguments, RunEvent objects built per call. Nothing here knows
about lineage-outbox; only environment variables route it through OutboxTransport."""

import os
import uuid
from datetime import UTC, datetime

from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, Run, RunEvent, RunState
from openlineage.client.facet_v2 import error_message_run, job_type_job
from opentelemetry import trace

PRODUCER = "https://example.com/lineage-demo"
client = None
job = None


def init(ctx):
    global client, job
    client = OpenLineageClient()
    job = Job(
        namespace=os.environ["LINEAGE_NAMESPACE"],
        name=f"{os.environ['VASTPIPELINE_PIPELINE_NAME']}.{os.environ['VASTPIPELINE_FUNCTION_DEPLOYMENT_NAME']}",
        facets={
            "jobType": job_type_job.JobTypeJobFacet(
                processingType="STREAMING", integration="VAST_DATAENGINE", jobType="FUNCTION"
            )
        },
    )


def _emit(state, run, inputs):
    client.emit(
        RunEvent(
            eventType=state,
            eventTime=datetime.now(UTC).isoformat(),
            run=run,
            job=job,
            producer=PRODUCER,
            inputs=inputs,
        )
    )


def handler(ctx, event):
    trace_id = trace.get_current_span().get_span_context().trace_id
    run = Run(runId=str(uuid.UUID(int=trace_id)))
    inputs = [InputDataset(namespace=f"s3://{event.bucket}", name=event.object_key)]
    _emit(RunState.START, run, inputs)
    try:
        if event.object_key.endswith(".bad"):
            raise ValueError(f"cannot process {event.object_key}")
    except Exception as err:
        failed = Run(
            runId=run.runId,
            facets={
                "errorMessage": error_message_run.ErrorMessageRunFacet(
                    message=str(err), programmingLanguage="python"
                )
            },
        )
        _emit(RunState.FAIL, failed, inputs)
        raise
    _emit(RunState.COMPLETE, run, inputs)
