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

A dataset's facets (a ``symlinks`` facet naming the table an object belongs to, say) are
converted to JSON once, when its :class:`DatasetRef` is made, and spliced into each event.
"""

from __future__ import annotations

import time
import traceback
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, NamedTuple, Protocol, Self

import orjson

from ._naming import s3_naming, trino_naming
from ._plain import dumps, event_key, to_plain
from ._runid import current_run_id, given_run_id, run_id_of_span, uuid_text

__all__ = [
    "DatasetRef",
    "Emitter",
    "LineageJob",
    "Run",
    "RunRecord",
    "TimedRun",
    "current_run_id",
    "failure",
    "s3_dataset",
    "trino_dataset",
]


class Emitter(Protocol):
    """What a run needs of an outbox: to hand it events (``Outbox`` is one)."""

    def emit(self, event: Any) -> bool: ...

    async def emit_async(self, event: Any) -> bool: ...


_RUN_EVENT_SCHEMA = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"


class _Facets(Mapping[str, Any]):
    """Dataset facets converted once: read them as a mapping of plain data; the run helpers
    splice ``json`` into every event that names the dataset."""

    __slots__ = ("_plain", "json")

    def __init__(self, facets: Mapping[str, Any]) -> None:
        if not isinstance(facets, Mapping):
            raise TypeError(f"facets must be a mapping of facet name to facet, not {type(facets).__name__}")
        plain = to_plain(dict(facets))
        self._plain: dict[str, Any] = plain
        #: The facets object as JSON, as openlineage-python's Serde writes it.
        self.json: bytes = dumps(plain)

    def __getitem__(self, key: str) -> Any:
        return self._plain[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._plain)

    def __len__(self) -> int:
        return len(self._plain)

    def __repr__(self) -> str:
        return repr(self._plain)

    def __eq__(self, other: object) -> bool:
        return dict(self._plain) == dict(other) if isinstance(other, Mapping) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.json)


class _DatasetFields(NamedTuple):
    namespace: str
    name: str
    facets: Mapping[str, Any] | None = None


class DatasetRef(_DatasetFields):
    """A dataset by its OpenLineage namespace and name, and optionally its dataset facets
    (openlineage-python facet objects or plain dicts, such as ``{"symlinks":
    SymlinksDatasetFacet(...)}``), converted to JSON once, here, for every event that
    names the dataset.

    Example::

        DatasetRef("trino://vast-trino:8080", "vast.lineage.orders")
    """

    __slots__ = ()

    def __new__(cls, namespace: str, name: str, facets: Mapping[str, Any] | None = None) -> Self:
        if facets is not None and facets.__class__ is not _Facets:
            facets = _Facets(facets) if facets else None
        return tuple.__new__(cls, (namespace, name, facets))


_new_ref = tuple.__new__  # DatasetRef(...) without its Python-level __new__: this is per event
# bucket -> its namespace, as openlineage-python's S3 helper writes it (a function reads few buckets).
_S3_NAMESPACES: dict[str, str] = {}
_S3_NAMESPACES_MAX = 1024
# table -> the symlinks facet naming it, converted once (a function's objects belong to few tables).
_TABLE_SYMLINKS: dict[tuple[str, str], _Facets] = {}
_TABLE_SYMLINKS_MAX = 1024


def s3_dataset(bucket: str, key: str, *, table: DatasetRef | None = None) -> DatasetRef:
    """An S3 object, named as openlineage-python's naming helper names it: ``s3://<bucket>``, ``<key>``.

    Args:
        bucket, key: the object.
        table: the table the object belongs to (``DatasetRef("trino://vast-trino:8080",
            "vast.lineage.orders_raw")``, say), added as a ``symlinks`` facet of type TABLE:
            OpenMetadata then resolves the object to that table (an S3 object alone never
            resolves to one), and DataHub names the dataset by it.

    Raises:
        ValueError: an empty bucket or key.
    """
    namespace = _S3_NAMESPACES.get(bucket) if bucket.__class__ is str else None
    if namespace is not None and key.__class__ is str and key and not key.isspace():
        if table is None:
            return _new_ref(DatasetRef, (namespace, key, None))
        return _new_ref(DatasetRef, (namespace, key, _table_symlink(table)))
    namespace, name = s3_naming(bucket, key)  # checks both, as openlineage-python does
    if bucket.__class__ is str and len(_S3_NAMESPACES) < _S3_NAMESPACES_MAX:
        _S3_NAMESPACES[bucket] = namespace
    return DatasetRef(namespace, name, None if table is None else _table_symlink(table))


def _table_symlink(table: DatasetRef) -> _Facets:
    """The ``symlinks`` facet naming ``table`` (type TABLE), made once per table."""
    namespace, name = table[0], table[1]
    facets = _TABLE_SYMLINKS.get((namespace, name))
    if facets is None:
        if not (isinstance(namespace, str) and namespace and isinstance(name, str) and name):
            raise ValueError(f"a table needs a namespace and a name, got {table!r}")
        from openlineage.client.facet_v2 import symlinks_dataset

        facets = _Facets(
            {
                "symlinks": symlinks_dataset.SymlinksDatasetFacet(
                    identifiers=[symlinks_dataset.Identifier(namespace=namespace, name=name, type="TABLE")]
                )
            }
        )
        if len(_TABLE_SYMLINKS) < _TABLE_SYMLINKS_MAX:
            _TABLE_SYMLINKS[(namespace, name)] = facets
    return facets


def trino_dataset(host: str, port: int | str, catalog: str, schema: str, table: str) -> DatasetRef:
    """A Trino table (such as a VAST DataBase table read through Trino), named as
    openlineage-python's helper names it: ``trino://<host>:<port>``, ``<catalog>.<schema>.<table>``.

    Raises:
        ValueError: an empty part.
    """
    return DatasetRef(*trino_naming(host, str(port), catalog, schema, table))


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
        timed: measure what each run's lineage costs the caller (``Run.overhead``, and the job's
            ``last_run``): diagnostics, for the local runner; it costs each run four clock reads.

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
        timed: bool = False,
    ) -> None:
        from openlineage.client import event_v2

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
        # What every event of every run repeats, as JSON, spliced in by RunRecord.to_json
        # (written by dumps: a value JSON cannot hold, a NaN, is refused here, by name).
        self._facets_json = dumps(self.plain_run_facets)
        self._tail_json = (
            b'"job":'
            + dumps(self.plain_job)
            + b',"producer":'
            + orjson.dumps(self.producer)
            + b',"schemaURL":'
            + orjson.dumps(_RUN_EVENT_SCHEMA)
            + b"}"
        )
        #: The Kafka message key of this job's run events (openlineage-python's rule).
        self.key = _event_key(self)
        # The last input and output lists written, as (tuple, JSON): a run's START and
        # COMPLETE share them.  One tuple per slot, replaced at once: safe across threads.
        self._written: list[tuple[tuple[Any, ...], bytes]] = [((), b"[]"), ((), b"[]")]
        #: Measure what each run's lineage costs the caller (``Run.overhead``, four clock
        #: reads a run) and keep the most recent run as ``last_run``: diagnostics, off by default.
        self.timed = timed
        #: The most recent :class:`Run` started for this job, when ``timed``.
        self.last_run: Run | None = None

    def __repr__(self) -> str:
        return f"LineageJob({self.namespace!r}, {self.name!r})"


class RunRecord(NamedTuple):
    """What one run event needs beyond its job; ``emit`` accepts it, the sidecar expands it."""

    job: LineageJob
    state: str
    time: float  # seconds since the epoch
    #: The run id as given (text), or a UUID's 128-bit value, written as text in the sidecar.
    run_id: str | int
    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    #: The error of a FAIL: the run helpers take its trace where it happened, without its
    #: frames (:func:`failure`), and the sidecar formats it (formatting reads source files:
    #: hundreds of microseconds the handler should not pay).
    error: BaseException | traceback.TracebackException | None = None

    def run_text(self) -> str:
        """The run id as it is written in the event."""
        rid = self.run_id
        return rid if rid.__class__ is str else uuid_text(rid)  # type: ignore[arg-type]

    def to_json(self, run_text: str | None = None) -> bytes:
        """The full RunEvent as JSON: what ``Serde.to_json`` writes for the equivalent
        event, after parsing.  The job's part is written once per :class:`LineageJob`;
        only the time, state, run id, datasets and an error are written per event.
        ``run_text``: :meth:`run_text`, if the caller has it already."""
        return record_json(
            self.job,
            self.state,
            self.time,
            run_text or self.run_text(),
            self.inputs,
            self.outputs,
            self.error,
        )

    def to_plain(self) -> dict[str, Any]:
        """The full RunEvent as plain data, as ``Serde`` would write the equivalent event."""

        facets: dict[str, Any] = dict(self.job.plain_run_facets)
        if self.error is not None:
            facets["errorMessage"] = _error_facet(self.error)
        return {
            "eventTime": datetime.fromtimestamp(self.time, UTC).isoformat(),
            "producer": self.job.producer,
            "schemaURL": _RUN_EVENT_SCHEMA,
            "run": {"runId": self.run_text(), "facets": facets},
            "job": self.job.plain_job,
            "eventType": self.state,
            "inputs": [_plain_dataset(d, "inputFacets") for d in self.inputs],
            "outputs": [_plain_dataset(d, "outputFacets") for d in self.outputs],
        }


def record_json(
    job: LineageJob,
    state: str,
    t: float,
    run_text: str,
    inputs: tuple[Any, ...],
    outputs: tuple[Any, ...],
    error: BaseException | traceback.TracebackException | None,
) -> bytes:
    """:meth:`RunRecord.to_json` of a record's fields (the sidecar's, once per run event: the
    job's part written once per :class:`LineageJob`, the rest spliced in)."""
    head = _HEADS.get(state) if state.__class__ is str else None
    if head is None:
        head = b'{"eventType":' + orjson.dumps(state) + b',"eventTime":"'
    if error is None:
        facets = job._facets_json
    else:
        facets = orjson.dumps({**job.plain_run_facets, "errorMessage": _error_facet(error)})
    return b'%s%s","run":{"runId":%s,"facets":%s},"inputs":%s,"outputs":%s,%s' % (
        head,
        _event_time(t),
        orjson.dumps(run_text),
        facets,
        _datasets_json(job, inputs, 0) if inputs else b"[]",
        _datasets_json(job, outputs, 1) if outputs else b"[]",
        job._tail_json,
    )


# The most characters of an error's message, and of its stack trace, a FAIL carries: a
# 10 MB message made the FAIL too_large, and the run never ended for the backend.
_MESSAGE_MAX = 16 * 1024
_STACK_TRACE_MAX = 64 * 1024


# What ``traceback`` says of an exception whose ``__str__`` fails (or gives no text).
_STR_FAILED = "<exception str() failed>"


def failure(error: BaseException) -> traceback.TracebackException:
    """``error``'s trace as a FAIL needs it, taken now, without its frames: an exception holds
    its traceback, and the traceback every frame's locals, until the FAIL is formatted; in an
    outage, a backlog of FAILs held each failed invocation's data (50 failures with 20 MB of
    locals: about 1 GB).  Its source lines are read when the sidecar formats it."""
    try:
        trace = traceback.TracebackException(
            type(error), error, error.__traceback__, lookup_lines=False, compact=True
        )
    except Exception as exc:
        # traceback read something of the exception's that raised (its __notes__, a SyntaxError's
        # lineno; on 3.12+ the self a NameError's suggestion looks at): not the handler's to get
        # in place of its own exception.  The frames, and what happened, without the exception.
        said = f"the trace of a {type(error).__qualname__} could not be taken ({type(exc).__name__})"
        return traceback.TracebackException(
            RuntimeError, RuntimeError(said), error.__traceback__, lookup_lines=False
        )
    # Each exception's notes as they were: its own list, which a later add_note would grow.
    queue = [trace]
    while queue:
        taken = queue.pop()
        if taken.__notes__.__class__ is list:
            taken.__notes__ = taken.__notes__.copy()
        queue.extend(t for t in (taken.__cause__, taken.__context__, *(taken.exceptions or ())) if t)
    return trace


def _error_facet(error: BaseException | traceback.TracebackException) -> dict[str, Any]:
    """The ``errorMessage`` facet of ``error``, whatever it is: a message whose ``__str__``
    fails or is no text is its class's name (as ``traceback`` says it), lone surrogates (a
    file name decoded with surrogateescape) are written as Python's stderr writes them, and
    a huge message or trace is cut in its middle: the FAIL always reaches the backend."""
    from openlineage.client.facet_v2 import error_message_run

    trace = failure(error) if isinstance(error, BaseException) else error
    message = str.__str__(str(trace))  # (what str(error) gave then, as plain text)
    if not message or message == _STR_FAILED:
        message = _type_name(trace)
    try:
        stack_trace = "".join(trace.format())
    except Exception as exc:  # traceback cannot either (a SyntaxError's text in bytes, odd notes)
        said = f"{_type_name(trace)}: {message} (its trace could not be formatted: {type(exc).__name__})"
        stack_trace = f"{''.join(trace.stack.format())}{said}\n"
    facet: dict[str, Any] = to_plain(
        error_message_run.ErrorMessageRunFacet(
            message=_bounded(message, _MESSAGE_MAX),
            programmingLanguage="python",
            stackTrace=_bounded(stack_trace, _STACK_TRACE_MAX),
        )
    )
    return facet


def _type_name(trace: traceback.TracebackException) -> str:
    """The exception's class, as ``traceback`` names it (``exc_type`` is deprecated in 3.13)."""
    name = getattr(trace, "exc_type_qualname", None)
    if name is None:
        exc_type = trace.exc_type
        name = "Exception" if exc_type is None else exc_type.__qualname__
    return str(name)


def _bounded(text: str, most: int) -> str:
    """``text`` as UTF-8 can hold it (lone surrogates backslash-escaped), its middle cut
    to ``most`` characters: the head and the tail (where the error is) kept."""
    if len(text) > most:
        half = most // 2
        text = f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# (whole second, b"YYYY-mm-ddTHH:MM:SS"): events come in bursts within one second.
_SECOND: tuple[int, bytes] = (-1, b"")
_LAST_SECOND = 253_402_300_799  # 9999-12-31T23:59:59
_HEADS = {
    state: b'{"eventType":"%s","eventTime":"' % state.encode() for state in ("START", "COMPLETE", "FAIL")
}


def _event_time(t: float) -> bytes:
    """``datetime.fromtimestamp(t, UTC).isoformat()``, a few times faster: the same
    rounding (half to even, to the microsecond), the date written once per second."""
    global _SECOND
    if not 0 <= t <= _LAST_SECOND:
        return datetime.fromtimestamp(t, UTC).isoformat().encode()
    second = int(t)
    micro = round((t - second) * 1e6)  # exact: t - int(t) is the fraction modf gives
    if micro >= 1_000_000:
        micro -= 1_000_000
        second += 1
    cached = _SECOND
    if cached[0] != second:
        if second > _LAST_SECOND:
            return datetime.fromtimestamp(t, UTC).isoformat().encode()
        cached = (second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S").encode())
        _SECOND = cached
    return b"%s.%06d+00:00" % (cached[1], micro) if micro else cached[1] + b"+00:00"


# namespace -> b'{"namespace":"<namespace>","name":': a function reads and writes few namespaces.
_NAMESPACES: dict[str, bytes] = {}
_NAMESPACES_MAX = 1024
_DATASET_TAILS = (b',"facets":{},"inputFacets":{}}', b',"facets":{},"outputFacets":{}}')
_KIND_TAILS = (b',"inputFacets":{}}', b',"outputFacets":{}}')


def _datasets_json(job: LineageJob, datasets: tuple[Any, ...] | DatasetRef, slot: int) -> bytes:
    """A record's inputs or outputs as JSON: a tuple of datasets, or one :class:`DatasetRef`
    alone (what an outbox's run records of ``inputs=[s3_dataset(...)]``: see ``Outbox.run``)."""
    last = job._written[slot]
    if last[0] is datasets or (datasets.__class__ is DatasetRef and last[0] == datasets):
        return last[1]  # (a run's START and COMPLETE: the same datasets, or equal DatasetRefs)
    parts = []
    immutable = True
    for dataset in (datasets,) if datasets.__class__ is DatasetRef else datasets:
        if dataset.__class__ is DatasetRef or isinstance(dataset, tuple):
            namespace = dataset[0]
            head = _NAMESPACES.get(namespace) if namespace.__class__ is str else None
            if head is None:
                head = b'{"namespace":' + orjson.dumps(namespace) + b',"name":'
                if namespace.__class__ is str and len(_NAMESPACES) < _NAMESPACES_MAX:
                    _NAMESPACES[namespace] = head
            # A DatasetRef's facets are always _Facets (its __new__ converts them).
            facets: _Facets | None = dataset[2] if dataset.__class__ is DatasetRef else None  # type: ignore[assignment]
            if facets is None:
                parts.append(head + orjson.dumps(dataset[1]) + _DATASET_TAILS[slot])
            else:  # converted when the DatasetRef was made
                parts.append(
                    head + orjson.dumps(dataset[1]) + b',"facets":' + facets.json + _KIND_TAILS[slot]
                )
        else:
            parts.append(dumps(to_plain(dataset)))
            immutable = False  # an openlineage-python dataset may change before the next event
    written = b"[" + b",".join(parts) + b"]"
    if immutable:
        job._written[slot] = (datasets, written)
    return written


def _event_key(job: LineageJob) -> str | None:
    return event_key({"run": {"facets": job.plain_run_facets}, "job": job.plain_job})


def _plain_dataset(dataset: Any, kind_facets: str) -> dict[str, Any]:
    if isinstance(dataset, tuple):
        facets = dataset[2] if dataset.__class__ is DatasetRef else None
        return {
            "namespace": dataset[0],
            "name": dataset[1],
            "facets": dict(facets) if facets else {},
            kind_facets: {},
        }

    plain: dict[str, Any] = to_plain(dataset)  # an openlineage-python dataset object
    return plain


_new_record = tuple.__new__


def _datasets(inputs: tuple[Any, ...] | str, name: str | None) -> tuple[Any, ...]:
    """A run's inputs as a tuple (an outbox's run may keep one :class:`DatasetRef` alone, or
    one without facets as its namespace and ``name``: see ``Outbox.run``)."""
    if name is not None:
        return (_new_ref(DatasetRef, (inputs, name, None)),)
    return (inputs,) if inputs.__class__ is DatasetRef else inputs  # type: ignore[return-value]


_now = time.time
_perf = time.perf_counter


class Run:
    """One run of a job: START on entry; COMPLETE on success, or FAIL with an
    ``errorMessage`` facet (message, language, stack trace) and the error re-raised.

    Use with ``with`` in sync code and ``async with`` in async code (which waits for room
    without blocking the loop under the ``block`` policy).  ``add_input``/``add_output``
    record datasets found while the run goes on; they appear from the next event.

    Outputs go on the COMPLETE event only: an output exists once the work is done, so a run
    that fails (or is still going) names none, and no backend draws an edge to an output
    from it (OpenMetadata's Kafka connector draws one from any START that has outputs).

    ``overhead`` is what the run's lineage cost the calling thread, in seconds, measured when
    its job is ``timed`` (four clock reads a run: off by default).
    """

    __slots__ = ("_inputs", "_name", "_outbox", "_outputs", "_rid", "job", "overhead")

    #: The inputs: a tuple of datasets; or (an outbox's run) one :class:`DatasetRef` alone,
    #: or one without facets as its namespace here and its name in ``_name`` (else None).
    _inputs: tuple[Any, ...] | str
    _name: str | None

    def __init__(
        self,
        outbox: Emitter,
        job: LineageJob,
        inputs: Iterable[Any] = (),
        outputs: Iterable[Any] = (),
        run_id: str | None = None,
    ) -> None:
        self._outbox = outbox
        self.job = job
        self._inputs = tuple(inputs)
        self._name = None
        self._outputs = outputs if outputs.__class__ is tuple else tuple(outputs)
        # Text as given, or a UUID's value: written as text in the sidecar (or when read).
        self._rid: str | int = given_run_id(run_id) if run_id else run_id_of_span()
        #: Seconds this run's lineage has cost the caller so far (when its job is ``timed``).
        self.overhead = 0.0

    @property
    def run_id(self) -> str:
        """The run's id: ``run_id`` as given, else the trace id (or a UUIDv7) as a UUID."""
        rid = self._rid
        return rid if rid.__class__ is str else uuid_text(rid)  # type: ignore[arg-type]

    def add_input(self, dataset: DatasetRef | Any) -> None:
        self._inputs, self._name = (*_datasets(self._inputs, self._name), dataset), None

    def add_output(self, dataset: DatasetRef | Any) -> None:
        self._outputs += (dataset,)

    def _record(self, state: str, error: BaseException | None = None) -> Any:
        # Any: a RunRecord is the outbox's own kind of event, emitted here only (not an Event).
        # tuple.__new__ rather than RunRecord(...): its generated __new__ is a Python call.
        outputs = self._outputs if state == "COMPLETE" else ()
        inputs = _datasets(self._inputs, self._name)
        trace = None if error is None else failure(error)
        return _new_record(RunRecord, (self.job, state, _now(), self._rid, inputs, outputs, trace))

    def __enter__(self) -> Self:
        self._outbox.emit(
            _new_record(RunRecord, (self.job, "START", _now(), self._rid, self._inputs, (), None))
        )
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        record: tuple[Any, ...]
        if exc is None:
            record = (self.job, "COMPLETE", _now(), self._rid, self._inputs, self._outputs, None)
        else:
            record = (self.job, "FAIL", _now(), self._rid, self._inputs, (), failure(exc))
        self._outbox.emit(_new_record(RunRecord, record))

    async def __aenter__(self) -> Self:
        started = time.perf_counter()
        await self._outbox.emit_async(self._record("START"))
        if self.job.timed:
            self.overhead += time.perf_counter() - started
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        started = time.perf_counter()
        await self._outbox.emit_async(self._record("COMPLETE" if exc is None else "FAIL", exc))
        if self.job.timed:
            self.overhead += time.perf_counter() - started


class TimedRun(Run):
    """A :class:`Run` of a ``timed`` job: what its lineage costs the caller is measured
    (``overhead``), and it is its job's ``last_run``."""

    __slots__ = ()

    def __init__(
        self,
        outbox: Emitter,
        job: LineageJob,
        inputs: Iterable[Any] = (),
        outputs: Iterable[Any] = (),
        run_id: str | None = None,
    ) -> None:
        started = _perf()
        super().__init__(outbox, job, inputs, outputs, run_id)
        self.overhead = _perf() - started
        job.last_run = self

    def __enter__(self) -> Self:
        started = _perf()
        super().__enter__()
        self.overhead += _perf() - started
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        started = _perf()
        super().__exit__(exc_type, exc, tb)
        self.overhead += _perf() - started
