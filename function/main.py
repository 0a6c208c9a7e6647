"""lineagefn: emits OpenLineage run events for every object a DataEngine trigger delivers.

DataEngine calls ``init(ctx)`` once per container, then ``handler(ctx, event)`` for each
object. Each call is one lineage run: START when the object arrives, then COMPLETE, or
FAIL with the error message (the handler re-raises, so DataEngine still records the
failure). The run id is the call's DataEngine trace id written as a UUID.

Lineage never waits on the backend: ``emit`` hands each event to the outbox, whose
sidecar ships it (over HTTP or to an Event Broker topic, as the pipeline's
``OPENLINEAGE_*`` variables say) and flushes at shutdown within ``OUTBOX_SHUTDOWN_TIMEOUT``.
"""

import os

from openlineage.client.facet_v2 import job_type_job

from outbox import LineageJob, Outbox, s3_dataset

PRODUCER = "https://example.com/lineage-demo"  # identifies the code that emits the events

outbox = None
job = None


def init(ctx):
    global outbox, job
    outbox = Outbox.from_env()  # transport from OPENLINEAGE_URL or OPENLINEAGE__TRANSPORT__*
    outbox.close_on_signal()  # flush on SIGTERM, then hand the signal on to the runtime
    job = LineageJob(
        os.environ["LINEAGE_NAMESPACE"],
        f"{os.environ['VASTPIPELINE_PIPELINE_NAME']}.{os.environ['VASTPIPELINE_FUNCTION_DEPLOYMENT_NAME']}",
        facets={
            "jobType": job_type_job.JobTypeJobFacet(
                processingType="STREAMING", integration="VAST_DATAENGINE", jobType="FUNCTION"
            )
        },
        producer=PRODUCER,
    )
    ctx.logger.info("lineage job %s/%s via %r", job.namespace, job.name, outbox)


def handler(ctx, event):
    # START now; COMPLETE when the block ends, or FAIL with the error, which is re-raised.
    with outbox.run(job, inputs=[s3_dataset(event.bucket, event.object_key)]) as run:
        ctx.logger.info("processing %s, lineage run %s", event.object_key, run.run_id)
        if event.object_key.endswith(".bad"):
            raise ValueError(f"cannot process {event.object_key}")
