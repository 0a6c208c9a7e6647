"""Run helpers: emit a run's START and its COMPLETE or FAIL for a few microseconds.

A :class:`LineageJob` is made once (in ``init``): the job's namespace, name, facets and
producer, already converted for the serializer.  Each call then records only what
changes (state, time, run id, datasets, error) in a small record; the sidecar expands it
into the full OpenLineage RunEvent, the same JSON openlineage-python would send for the
equivalent ``RunEvent``.

Example::

    job = LineageJob("vast-dataengine://my-tenant", "lineage-demo.lineagefn")

    def handler(ctx, event):
        with outbox.run(job, inputs=[s3_dataset(event.bucket, event.object_key)]):
            process(event)  # START before, COMPLETE after, or FAIL with the error (re-raised)
"""

from __future__ import annotations

import time
import traceback
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, Self

from openlineage.client.naming.dataset import S3, Trino
from openlineage.client.uuid import generate_new_uuid
from opentelemetry import trace

if TYPE_CHECKING:
    from ._outbox import Outbox

__all__ = ["DatasetRef", "LineageJob", "Run", "RunRecord", "current_run_id", "s3_dataset", "trino_dataset"]

_RUN_EVENT_SCHEMA = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"


class DatasetRef(NamedTuple):
    """A dataset by its OpenLineage namespace and name."""

    namespace: str
    name: str


def s3_dataset(bucket: str, key: str) -> DatasetRef:
    """An S3 object, named by openlineage-python's naming helper: ``s3://<bucket>``, ``<key>``.

    Raises:
        ValueError: an empty bucket or key.
    """
    naming = S3(bucket_name=bucket, object_key=key)
    return DatasetRef(naming.get_namespace(), naming.get_name())


def trino_dataset(host: str, port: int | str, catalog: str, schema: str, table: str) -> DatasetRef:
    """A Trino table (such as a VAST DataBase table read through Trino), named by
    openlineage-python's helper: ``trino://<host>:<port>``, ``<catalog>.<schema>.<table>``.

    Raises:
        ValueError: an empty part.
    """
    naming = Trino(host=host, port=str(port), catalog=catalog, schema=schema, table=table)
    return DatasetRef(naming.get_namespace(), naming.get_name())


def current_run_id() -> str:
    """The current OpenTelemetry span's trace id as a UUID (trace
    ``00005015000000162e048a6dbdde4eb9`` is run ``00005015-0000-0016-2e04-8a6dbdde4eb9``),
    so a lineage run maps to one trace; a new UUIDv7 (openlineage-python's
    ``generate_new_uuid``) when there is no valid span."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        return str(uuid.UUID(int=context.trace_id))
    return str(generate_new_uuid())


class LineageJob:
    """A job's identity and facets, prepared once for many runs.

    Args:
        namespace: the job namespace (``vast-dataengine://my-tenant``).
        name: the job name (``lineage-demo.lineagefn``).
        facets: openlineage-python job facets (``{"jobType": JobTypeJobFacet(...)}``).
        producer: the events' ``producer`` URI (default: openlineage-python's).
        run_facets: run facets every event of every run carries, such as
            ``{"processing_engine": ProcessingEngineRunFacet(...)}`` (DataHub refuses events
            that name no processing engine unless their producer is OpenLineage's or Airflow's).

    Example::

        from openlineage.client.facet_v2 import processing_engine_run

        job = LineageJob(
            "vast-dataengine://my-tenant",
            "lineage-demo.lineagefn",
            run_facets={
                "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
                    version="5.3", name="VAST_DATAENGINE", openlineageAdapterVersion=outbox.__version__
                )
            },
        )
    """

    def __init__(
        self,
        namespace: str,
        name: str,
        *,
        facets: Mapping[str, Any] | None = None,
        producer: str | None = None,
        run_facets: Mapping[str, Any] | None = None,
    ) -> None:
        from openlineage.client import event_v2

        from ._serde import to_plain

        if not namespace or not name:
            raise ValueError(f"a job needs a namespace and a name, got {namespace!r} and {name!r}")
        self.namespace = namespace
        self.name = name
        self.producer = producer or event_v2.PRODUCER
        # The job part of every event, converted once (facets included).
        job = event_v2.Job(namespace=namespace, name=name, facets=dict(facets or {}))
        self.plain_job: dict[str, Any] = to_plain(job)
        # The run facets every event carries, converted once.
        run = event_v2.Run(runId=str(uuid.UUID(int=0)), facets=dict(run_facets or {}))
        self.plain_run_facets: dict[str, Any] = to_plain(run).get("facets") or {}
        #: The most recent :class:`Run` started for this job (diagnostics: its ``overhead``).
        self.last_run: Run | None = None

    def __repr__(self) -> str:
        return f"LineageJob({self.namespace!r}, {self.name!r})"


class RunRecord(NamedTuple):
    """What one run event needs beyond its job; ``emit`` accepts it, the sidecar expands it."""

    job: LineageJob
    state: str
    time: float  # seconds since the epoch
    run_id: str
    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    #: The error of a FAIL; formatted in the sidecar (formatting a traceback reads source
    #: files: hundreds of microseconds the handler should not pay).
    error: BaseException | None = None

    def to_plain(self) -> dict[str, Any]:
        """The full RunEvent as plain data, as ``Serde`` would write the equivalent event."""
        from ._serde import to_plain

        facets: dict[str, Any] = dict(self.job.plain_run_facets)
        if self.error is not None:
            from openlineage.client.facet_v2 import error_message_run

            error = self.error
            facets["errorMessage"] = to_plain(
                error_message_run.ErrorMessageRunFacet(
                    message=str(error) or type(error).__name__,
                    programmingLanguage="python",
                    stackTrace="".join(traceback.format_exception(error)),
                )
            )
        return {
            "eventTime": datetime.fromtimestamp(self.time, UTC).isoformat(),
            "producer": self.job.producer,
            "schemaURL": _RUN_EVENT_SCHEMA,
            "run": {"runId": self.run_id, "facets": facets},
            "job": self.job.plain_job,
            "eventType": self.state,
            "inputs": [_plain_dataset(d, "inputFacets") for d in self.inputs],
            "outputs": [_plain_dataset(d, "outputFacets") for d in self.outputs],
        }


def _plain_dataset(dataset: Any, kind_facets: str) -> dict[str, Any]:
    if isinstance(dataset, tuple):
        namespace, name = dataset
        return {"namespace": namespace, "name": name, "facets": {}, kind_facets: {}}
    from ._serde import to_plain

    plain: dict[str, Any] = to_plain(dataset)  # an openlineage-python dataset object
    return plain


class Run:
    """One run of a job: START on entry; COMPLETE on success, or FAIL with an
    ``errorMessage`` facet (message, language, stack trace) and the error re-raised.

    Use with ``with`` in sync code and ``async with`` in async code (which waits for room
    without blocking the loop under the ``block`` policy).  ``add_input``/``add_output``
    record datasets found while the run goes on; they appear from the next event.
    """

    __slots__ = ("_inputs", "_outbox", "_outputs", "job", "overhead", "run_id")

    def __init__(
        self,
        outbox: Outbox,
        job: LineageJob,
        *,
        inputs: Iterable[Any] = (),
        outputs: Iterable[Any] = (),
        run_id: str | None = None,
    ) -> None:
        started = time.perf_counter()
        self._outbox = outbox
        self.job = job
        self._inputs = tuple(inputs)
        self._outputs = tuple(outputs)
        self.run_id = run_id or current_run_id()
        #: Seconds this run's lineage has cost the caller so far (construction included).
        self.overhead = time.perf_counter() - started
        job.last_run = self

    def add_input(self, dataset: DatasetRef | Any) -> None:
        self._inputs += (dataset,)

    def add_output(self, dataset: DatasetRef | Any) -> None:
        self._outputs += (dataset,)

    def _record(self, state: str, error: BaseException | None = None) -> RunRecord:
        return RunRecord(self.job, state, time.time(), self.run_id, self._inputs, self._outputs, error)

    def __enter__(self) -> Self:
        started = time.perf_counter()
        self._outbox.emit(self._record("START"))
        self.overhead += time.perf_counter() - started
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        started = time.perf_counter()
        self._outbox.emit(self._record("COMPLETE" if exc is None else "FAIL", exc))
        self.overhead += time.perf_counter() - started

    async def __aenter__(self) -> Self:
        started = time.perf_counter()
        await self._outbox.emit_async(self._record("START"))
        self.overhead += time.perf_counter() - started
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        started = time.perf_counter()
        await self._outbox.emit_async(self._record("COMPLETE" if exc is None else "FAIL", exc))
        self.overhead += time.perf_counter() - started
