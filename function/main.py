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

from openlineage.client.facet_v2 import job_type_job, processing_engine_run

from outbox import DatasetRef, LineageJob, Outbox, s3_dataset
from outbox import __version__ as outbox_version

PRODUCER = "https://example.com/lineage-demo"  # identifies the code that emits the events
ENGINE = "VAST_DATAENGINE"  # the processing_engine facet's name (DataHub's "orchestrator")

outbox = None
job = None
outputs = []  # LINEAGE_OUTPUTS: dataset URI templates, {bucket} and {object_key} filled per event
input_table = None  # LINEAGE_INPUT_TABLE: the template of the table each input object belongs to


def output_templates(spec):
    """``LINEAGE_OUTPUTS``: comma-separated dataset URIs ``{namespace}/{name}`` (namespace
    ``scheme://authority``, name the rest without its leading slash, as OpenLineage's naming
    spec writes them), where ``{bucket}`` and ``{object_key}`` are filled in per event:
    ``trino://vast-trino:8080/vast.lineage.{bucket}_orders`` names the table
    ``vast.lineage.docs-src_orders`` in namespace ``trino://vast-trino:8080``."""
    templates = [item.strip() for item in spec.split(",") if item.strip()]
    for template in templates:
        try:
            dataset_of(template, "bucket", "object/key")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"LINEAGE_OUTPUTS: {template!r} is not a dataset URI such as "
                f"trino://vast-trino:8080/vast.lineage.{{bucket}}_orders ({exc})"
            ) from None
    return templates


def input_table_template(spec, name="LINEAGE_INPUT_TABLE"):
    """``LINEAGE_INPUT_TABLE``: one dataset URI, written as in ``LINEAGE_OUTPUTS``, naming the
    table the input object belongs to (``trino://vast-trino:8080/vast.lineage.{bucket}_raw``).
    The S3 input then carries it as a ``symlinks`` facet of type TABLE, which OpenMetadata
    resolves to that table (an S3 object alone never resolves to one)."""
    spec = spec.strip()
    if not spec:
        return None
    if "," in spec:
        raise ValueError(f"{name}: {spec!r} names more than one dataset; an object belongs to one table")
    try:
        dataset_of(spec, "bucket", "object/key")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"{name}: {spec!r} is not a dataset URI such as "
            f"trino://vast-trino:8080/vast.lineage.{{bucket}}_raw ({exc})"
        ) from None
    return spec


def dataset_of(template, bucket, object_key):
    uri = template.format(bucket=bucket, object_key=object_key)
    scheme, separator, rest = uri.partition("://")
    authority, _, name = rest.partition("/")
    if not (scheme and separator and authority and name.lstrip("/")):
        raise ValueError("expected scheme://authority/name; only {bucket} and {object_key} are filled in")
    return DatasetRef(f"{scheme}://{authority}", name.lstrip("/"))


def init(ctx):
    global outbox, job, outputs, input_table
    outputs = output_templates(os.environ.get("LINEAGE_OUTPUTS", ""))
    input_table = input_table_template(os.environ.get("LINEAGE_INPUT_TABLE", ""))
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
        # Every event names the platform that ran it (DataHub refuses events that do not).
        run_facets={
            "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
                version=os.environ.get("LINEAGE_ENGINE_VERSION", "unknown"),
                name=ENGINE,
                openlineageAdapterVersion=outbox_version,
            )
        },
    )
    ctx.logger.info("lineage job %s/%s via %r", job.namespace, job.name, outbox)


def handler(ctx, event):
    # START now; COMPLETE when the block ends, or FAIL with the error, which is re-raised.
    # The outputs go on COMPLETE only: a run that fails names none.
    made = [dataset_of(template, event.bucket, event.object_key) for template in outputs]
    table = dataset_of(input_table, event.bucket, event.object_key) if input_table else None
    source = s3_dataset(event.bucket, event.object_key, table=table)
    with outbox.run(job, inputs=[source], outputs=made) as run:
        ctx.logger.info("processing %s, lineage run %s", event.object_key, run.run_id)
        if event.object_key.endswith(".bad"):
            raise ValueError(f"cannot process {event.object_key}")
