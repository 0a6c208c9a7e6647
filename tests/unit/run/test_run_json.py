"""The run helpers write their events' JSON by splicing (the job's part written once per
LineageJob): it must be what openlineage-python's Serde writes for the equivalent RunEvent,
for any names, times, states, datasets and errors; and the handler-side shortcuts (the
event time, the run id, s3_dataset) must give exactly what the slow ways give."""

import datetime
import json
import threading
import traceback
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    error_message_run,
    job_type_job,
    parent_run,
    processing_engine_run,
    symlinks_dataset,
)
from openlineage.client.naming.dataset import S3
from openlineage.client.serde import Serde
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from outbox import DatasetRef, LineageJob, Outbox, current_run_id, s3_dataset
from outbox._run._run import RunRecord, _event_time
from outbox._run._runid import uuid7 as _uuid7
from outbox._run._runid import uuid_text as _uuid_text
from outbox._run._serde import event_key, serialize
from outbox.transports import MemoryTransport

text = st.text(min_size=1, max_size=30)  # any code point: quotes, backslashes, controls, emoji
job_facets = st.one_of(
    st.just({}),
    st.just(
        {
            "jobType": job_type_job.JobTypeJobFacet(
                processingType="STREAMING", integration="VAST", jobType="FUNCTION"
            )
        }
    ),
)
run_facets = st.one_of(
    st.just({}),
    st.builds(
        lambda v: {
            "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
                version=v, name="VAST_DATAENGINE"
            )
        },
        text,
    ),
    st.builds(
        lambda ns, name: {
            "parent": parent_run.ParentRunFacet(
                run=parent_run.Run(runId=str(uuid.UUID(int=7))), job=parent_run.Job(namespace=ns, name=name)
            )
        },
        text,
        text,
    ),
)
# Times from 1970 to 9999, and exact half microseconds (where the rounding rule shows).
times = st.one_of(
    st.floats(min_value=0, max_value=253_402_300_799.0, allow_nan=False),
    st.builds(lambda s, us: s + (us + 0.5) / 1e6, st.integers(0, 2**33), st.integers(0, 999_999)),
)
# (namespace, name, the table it belongs to or None: a symlinks facet of type TABLE)
datasets = st.lists(st.tuples(text, text, st.none() | st.tuples(text, text)), max_size=3)


def symlink(table):
    """openlineage-python's symlinks facet naming ``table`` as a TABLE."""
    return symlinks_dataset.SymlinksDatasetFacet(
        identifiers=[symlinks_dataset.Identifier(namespace=table[0], name=table[1], type="TABLE")]
    )


def refs_of(items):
    return tuple(
        DatasetRef(ns, n, None if table is None else {"symlinks": symlink(table)}) for ns, n, table in items
    )


def their_dataset(kind, ref):
    """openlineage-python's dataset object for one of ours, its facet built its own way."""
    facets = {}
    if ref.facets is not None:
        table = ref.facets["symlinks"]["identifiers"][0]
        facets["symlinks"] = symlink((table["namespace"], table["name"]))
    return kind(namespace=ref.namespace, name=ref.name, facets=facets)


def reference(record: RunRecord, job_facet_value, run_facet_value) -> dict:
    """openlineage-python's JSON for the RunEvent equivalent to ``record``, built its way."""
    facets = dict(run_facet_value)
    if record.error is not None:
        facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=str(record.error) or type(record.error).__name__,
            programmingLanguage="python",
            stackTrace="".join(traceback.format_exception(record.error)),
        )
    event = RunEvent(
        eventType=RunState(record.state),
        eventTime=datetime.datetime.fromtimestamp(record.time, datetime.UTC).isoformat(),
        run=Run(runId=record.run_id, facets=facets),
        job=Job(namespace=record.job.namespace, name=record.job.name, facets=job_facet_value),
        producer=record.job.producer,
        inputs=[their_dataset(InputDataset, ref) for ref in record.inputs],
        outputs=[their_dataset(OutputDataset, ref) for ref in record.outputs],
    )
    return json.loads(Serde.to_json(event))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    namespace=text,
    name=text,
    producer=st.one_of(st.none(), text),
    job_facet_value=job_facets,
    run_facet_value=run_facets,
    state=st.sampled_from([s.value for s in RunState]),
    t=times,
    inputs=datasets,
    outputs=datasets,
    failed=st.booleans(),
    message=st.text(max_size=20),
)
def test_spliced_json_is_what_serde_writes(
    namespace, name, producer, job_facet_value, run_facet_value, state, t, inputs, outputs, failed, message
):
    job = LineageJob(namespace, name, facets=job_facet_value, producer=producer, run_facets=run_facet_value)
    error = ValueError(message) if failed else None
    record = RunRecord(job, state, t, str(uuid.uuid4()), refs_of(inputs), refs_of(outputs), error)
    expected = reference(record, job_facet_value, run_facet_value)
    assert orjson.loads(record.to_json()) == expected
    # The same record again (a run's START and COMPLETE share their dataset lists): the
    # lists written once are reused, and still right.
    again = record._replace(state="COMPLETE", error=None)
    assert orjson.loads(again.to_json()) == reference(again, job_facet_value, run_facet_value)
    serialized = serialize(record)
    assert serialized.body == record.to_json()
    assert serialized.key == event_key(expected)  # openlineage-python's Kafka message key
    assert serialized.run_id == record.run_id


@settings(max_examples=200, deadline=None)
@given(run_id=st.text(max_size=40), namespace=text, name=text, ds=datasets, state=text)
def test_any_text_is_escaped_as_the_plain_form_writes_it(run_id, namespace, name, ds, state):
    """Run ids that are not UUIDs and states openlineage-python has no name for are sent as
    given (Marquez takes the first): the spliced JSON parses to what to_plain builds."""
    job = LineageJob(namespace, name)
    refs = refs_of(ds)
    record = RunRecord(job, state, 1_764_669_600.25, run_id, refs, refs)
    assert orjson.loads(record.to_json()) == record.to_plain()


def test_openlineage_dataset_objects_are_written_each_time():
    """Dataset objects (attrs, mutable) are not cached between a run's events: a facet added
    after START is in COMPLETE."""
    from openlineage.client.facet_v2 import schema_dataset

    job = LineageJob("ns", "j")
    dataset = InputDataset(namespace="s3://b", name="k", facets={})
    inputs = (dataset,)
    start = RunRecord(job, "START", 1.0, str(uuid.uuid4()), inputs, ())
    assert orjson.loads(start.to_json())["inputs"][0]["facets"] == {}
    dataset.facets["schema"] = schema_dataset.SchemaDatasetFacet(fields=[])
    complete = start._replace(state="COMPLETE")
    assert "schema" in orjson.loads(complete.to_json())["inputs"][0]["facets"]
    assert orjson.loads(complete.to_json()) == complete.to_plain()


def test_datasets_added_during_a_run_are_in_its_later_events():
    transport = MemoryTransport()
    outbox = Outbox(transport, linger=0, close_at_exit=False)
    job = LineageJob("ns", "j")
    with outbox.run(job, inputs=[s3_dataset("b", "in")]) as run:
        run.add_output(s3_dataset("b", "out"))
    outbox.close(5)
    start, complete = transport.events
    assert [d["name"] for d in start["inputs"]] == ["in"]
    assert start["outputs"] == []
    assert [d["name"] for d in complete["outputs"]] == ["out"]


@pytest.mark.parametrize(
    "form",
    ["one", "one-with-table", "two", "tuple", "generator", "one-then-added", "async", "timed", "no-name"],
)
def test_a_runs_events_are_the_same_whatever_form_its_inputs_take(form):
    # An outbox's run records one dataset as its namespace and name (or, with facets, the
    # DatasetRef alone), others as a tuple: the events sent are the same as a RunRecord of the
    # same datasets writes.
    import asyncio

    transport = MemoryTransport()
    outbox = Outbox(transport, linger=0, close_at_exit=False)
    job = LineageJob("ns", "j", timed=form == "timed")
    table = DatasetRef("trino://h:8080", "c.s.t")
    a = s3_dataset("b", "a.csv", table=table if form == "one-with-table" else None)
    if form == "no-name":  # (not a dataset a backend takes, but sent as it was given)
        a = DatasetRef("s3://b", None)  # type: ignore[arg-type]
    b = s3_dataset("b", "b.csv")
    given: Any = {
        "two": [a, b],
        "tuple": (a, b),
        "generator": (d for d in (a, b)),
    }.get(form, [a])
    if form == "async":

        async def main() -> None:
            async with outbox.run(job, inputs=given):
                pass

        asyncio.run(main())
    else:
        with outbox.run(job, inputs=given) as run:
            if form == "one-then-added":
                run.add_input(b)
    outbox.close(5)
    start, complete = transport.events
    first = (a, b) if form in ("two", "tuple", "generator") else (a,)
    last = (a, b) if form in ("two", "tuple", "generator", "one-then-added") else (a,)
    for event, datasets in ((start, first), (complete, last)):
        record = RunRecord(job, event["eventType"], 1.0, event["run"]["runId"], datasets, ())
        assert event["inputs"] == record.to_plain()["inputs"]


def test_outputs_go_on_complete_only_so_a_failed_run_names_none():
    """An output exists once the work is done: START and FAIL carry none (OpenMetadata's
    Kafka connector draws a pipeline -> table edge from any START that names an output),
    COMPLETE carries them all, those given at the start and those added on the way."""
    transport = MemoryTransport()
    outbox = Outbox(transport, linger=0, close_at_exit=False)
    job = LineageJob("ns", "j")
    table = DatasetRef("trino://h:8080", "vast.lineage.orders")
    with outbox.run(job, inputs=[s3_dataset("b", "good")], outputs=[table]) as run:
        run.add_output(s3_dataset("b", "also"))
    with (
        pytest.raises(ValueError, match="cannot"),
        outbox.run(job, inputs=[s3_dataset("b", "bad")], outputs=[table]),
    ):
        raise ValueError("cannot")
    outbox.close(5)
    kinds = [(e["eventType"], [d["name"] for d in e["outputs"]]) for e in transport.events]
    assert kinds == [
        ("START", []),
        ("COMPLETE", ["vast.lineage.orders", "also"]),
        ("START", []),
        ("FAIL", []),
    ]
    assert all(len(e["inputs"]) == 1 for e in transport.events)  # inputs on every event


def test_s3_dataset_with_its_table_carries_a_table_symlink_as_openlineage_python_writes_it():
    table = DatasetRef("trino://vast-trino:8080", "vast.lineage.orders_raw")
    ours = s3_dataset("docs-src", "lineage-src/orders.csv", table=table)
    assert ours[:2] == ("s3://docs-src", "lineage-src/orders.csv")
    theirs = InputDataset(
        namespace="s3://docs-src", name="lineage-src/orders.csv", facets={"symlinks": symlink(table)}
    )
    expected = json.loads(Serde.to_json(theirs))["facets"]
    assert ours.facets == expected
    # Made once per table: a second object of the same table shares the converted facets.
    assert s3_dataset("docs-src", "lineage-src/other.csv", table=table).facets is ours.facets
    job = LineageJob("ns", "j")
    record = RunRecord(job, "COMPLETE", 1.0, str(uuid.uuid4()), (ours,), ())
    assert orjson.loads(record.to_json())["inputs"][0]["facets"] == expected
    assert orjson.loads(record.to_json()) == record.to_plain()
    with pytest.raises(ValueError, match="a table needs a namespace and a name"):
        s3_dataset("docs-src", "k", table=DatasetRef("", "t"))


def test_a_dataset_ref_converts_its_facets_once_and_refuses_a_non_mapping():
    from openlineage.client.facet_v2 import documentation_dataset

    ref = DatasetRef("ns", "n", {"documentation": documentation_dataset.DocumentationDatasetFacet("d")})
    assert ref.facets["documentation"]["description"] == "d"
    assert DatasetRef(*ref).facets is ref.facets  # already converted: kept as it is
    assert DatasetRef("ns", "n", {}).facets is None
    with pytest.raises(TypeError, match="facets must be a mapping"):
        DatasetRef("ns", "n", ["documentation"])


@settings(max_examples=2000, deadline=None)
@given(t=times)
def test_event_time_is_datetime_isoformat(t):
    assert _event_time(t).decode() == datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat()


@pytest.mark.parametrize(
    "t", [0.0, 1.0, 0.0000005, 0.0000015, 59.9999995, 1_764_669_599.9999996, 253_402_300_799.0]
)
def test_event_time_edges(t):
    assert _event_time(t).decode() == datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat()


def test_event_time_outside_the_fast_range_falls_back():
    assert _event_time(-1.5).decode() == datetime.datetime.fromtimestamp(-1.5, datetime.UTC).isoformat()


def test_run_ids_without_a_span_are_uuid7_and_unique():
    before = datetime.datetime.now(datetime.UTC).timestamp() * 1000
    ids = [current_run_id() for _ in range(20_000)]
    after = datetime.datetime.now(datetime.UTC).timestamp() * 1000
    assert len(set(ids)) == len(ids)
    for text_id in ids[:50] + ids[-50:]:
        parsed = uuid.UUID(text_id)
        assert str(parsed) == text_id
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        assert before - 1 <= parsed.int >> 80 <= after + 1  # milliseconds since the epoch


def test_run_ids_from_threads_do_not_collide():
    seen: list[list[str]] = []

    def make():
        seen.append([current_run_id() for _ in range(5000)])

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [i for ids in seen for i in ids]
    assert len(set(flat)) == len(flat) == 20_000


def test_run_id_in_a_span_is_its_trace_id():
    trace_id = 0x00005015000000162E048A6DBDDE4EB9
    context = SpanContext(trace_id=trace_id, span_id=1, is_remote=False, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(context)):
        assert current_run_id() == "00005015-0000-0016-2e04-8a6dbdde4eb9" == str(uuid.UUID(int=trace_id))


def test_two_runs_in_one_span_do_not_share_a_run_id(caplog):
    # The first run of a trace takes the trace id; a later one (in the same span, or in a
    # child span of the same trace) gets a fresh id, said once; another trace starts again.
    import outbox._run._runid

    outbox._run._runid._shared_trace_said = False
    box = Outbox(MemoryTransport(), close_at_exit=False)
    job = LineageJob("ns", "job")

    def span(trace_id: int, span_id: int = 1):
        context = SpanContext(trace_id=trace_id, span_id=span_id, is_remote=False, trace_flags=TraceFlags(1))
        return trace.use_span(NonRecordingSpan(context))

    first_trace, second_trace = uuid.uuid4().int, uuid.uuid4().int
    with caplog.at_level("WARNING", logger="outbox"), span(first_trace):
        ids = [box.run(job).run_id for _ in range(3)]
        with span(first_trace, span_id=2):
            ids.append(box.run(job).run_id)
    with span(second_trace):
        other = box.run(job).run_id
    box.close(1)
    assert ids[0] == str(uuid.UUID(int=first_trace))
    assert len(set(ids)) == 4
    assert all(uuid.UUID(i).version == 7 for i in ids[1:])
    assert other == str(uuid.UUID(int=second_trace))
    said = [r for r in caplog.records if "second outbox.run()" in r.getMessage()]
    assert len(said) == 1
    assert ids[1] in said[0].getMessage()


def test_the_taken_trace_ids_are_bounded():
    import outbox._run._runid

    box = Outbox(MemoryTransport(), close_at_exit=False)
    job = LineageJob("ns", "job")
    for _ in range(outbox._run._runid._TAKEN_MAX + 100):
        context = SpanContext(
            trace_id=uuid.uuid4().int, span_id=1, is_remote=False, trace_flags=TraceFlags(1)
        )
        with trace.use_span(NonRecordingSpan(context)):
            box.run(job)
    box.close(1)
    assert len(outbox._run._runid._taken) <= outbox._run._runid._TAKEN_MAX


def test_once_the_taken_ids_are_full_the_oldest_trace_goes_and_the_newest_stay_taken():
    # The ids are evicted oldest first: a run in the newest trace still finds it taken (a
    # second run there gets a fresh id), a run in the oldest trace takes it again.
    import outbox._run._runid

    box = Outbox(MemoryTransport(), close_at_exit=False)
    job = LineageJob("ns", "job")

    def run_in(trace_id: int) -> str:
        context = SpanContext(trace_id=trace_id, span_id=1, is_remote=False, trace_flags=TraceFlags(1))
        with trace.use_span(NonRecordingSpan(context)):
            return box.run(job).run_id

    traces = [uuid.uuid4().int for _ in range(outbox._run._runid._TAKEN_MAX + 10)]
    assert [run_in(t) for t in traces] == [str(uuid.UUID(int=t)) for t in traces]
    assert len(outbox._run._runid._taken) == outbox._run._runid._TAKEN_MAX
    newest_again = run_in(traces[-1])
    oldest_again = run_in(traces[0])
    box.close(1)
    assert newest_again != str(uuid.UUID(int=traces[-1]))
    assert uuid.UUID(newest_again).version == 7
    assert oldest_again == str(uuid.UUID(int=traces[0]))


class _OtherContext(SpanContext):
    """A SpanContext of another class: read through its properties, not by index."""


@pytest.mark.parametrize("by_index", [True, False], ids=["by-index", "by-property"])
@pytest.mark.parametrize("context_class", [SpanContext, _OtherContext], ids=["api", "subclass"])
def test_a_run_reads_the_spans_context_alike_by_index_or_by_property(monkeypatch, by_index, context_class):
    # The run's path reads a SpanContext by index (checked once at import); any other
    # class, or a layout that failed the check, is read through the API's properties.
    import outbox._run._runid

    assert outbox._run._runid._SPAN_CONTEXT_IS_TUPLE  # in force with this opentelemetry-api
    monkeypatch.setattr(outbox._run._runid, "_SPAN_CONTEXT_IS_TUPLE", by_index)
    box = Outbox(MemoryTransport(), close_at_exit=False)
    job = LineageJob("ns", "job")
    trace_id = uuid.uuid4().int
    valid = context_class(trace_id, 7, False, TraceFlags(1))
    invalid = context_class(0, 0, False)
    with trace.use_span(NonRecordingSpan(valid)):
        first, second = box.run(job).run_id, box.run(job).run_id
    with trace.use_span(NonRecordingSpan(invalid)):
        outside = box.run(job).run_id
    box.close(1)
    assert first == str(uuid.UUID(int=trace_id))
    assert uuid.UUID(second).version == 7
    assert second != first
    assert uuid.UUID(outside).version == 7


class _DerivedSpan(NonRecordingSpan):
    """A span class whose context is not its ``_context``: read through its method."""

    def get_span_context(self) -> SpanContext:
        return SpanContext(self._context.trace_id + 1, 7, False, TraceFlags(1))


@pytest.mark.parametrize("span_class", ["api", "sdk", "derived"])
def test_a_run_reads_the_context_of_any_span_class_as_its_method_gives_it(span_class):
    # The run's path reads ``_context`` directly for the span classes whose method is known to
    # return it (the API's NonRecordingSpan, the SDK's Span); any other class through its method.
    import outbox._run._runid

    trace_id = uuid.uuid4().int >> 1
    context = SpanContext(trace_id, 7, False, TraceFlags(1))
    if span_class == "sdk":
        from opentelemetry.sdk.trace import TracerProvider

        tracer = TracerProvider().get_tracer("tests")
        span = tracer.start_span("x", context=trace.set_span_in_context(NonRecordingSpan(context)))
        trace_id = span.get_span_context().trace_id  # (a child: the same trace)
    else:
        span = (_DerivedSpan if span_class == "derived" else NonRecordingSpan)(context)
    box = Outbox(MemoryTransport(), close_at_exit=False)
    job = LineageJob("ns", "job")
    with trace.use_span(span):
        first = box.run(job).run_id
    box.close(1)
    expected = trace_id + 1 if span_class == "derived" else trace_id
    assert first == str(uuid.UUID(int=expected))
    assert outbox._run._runid._READS_CONTEXT[span.__class__] is (span_class != "derived")


def test_a_span_context_layout_other_than_the_tuple_is_read_by_property(monkeypatch):
    import outbox._run._runid

    class Reordered(tuple):  # a later opentelemetry-api that stored its fields otherwise
        def __new__(cls, trace_id, span_id, is_remote):
            return tuple.__new__(cls, (span_id, trace_id, is_remote))

        trace_id = property(lambda self: self[1])
        is_valid = property(lambda self: True)

    monkeypatch.setattr(outbox._run._runid.trace, "SpanContext", Reordered)
    assert outbox._run._runid._span_context_is_tuple() is False


@given(value=st.integers(0, 2**128 - 1))
def test_uuid_text_is_str_of_uuid(value):
    assert _uuid_text(value) == str(uuid.UUID(int=value))


def test_uuid7_bits():
    value = _uuid7()
    parsed = uuid.UUID(int=value)
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122


@given(bucket=st.text(max_size=10), key=st.text(max_size=10))
def test_s3_dataset_is_openlineage_pythons_naming_even_once_the_bucket_is_known(bucket, key):
    for _ in range(2):  # the second call takes the shortcut for a known bucket
        try:
            naming = S3(bucket_name=bucket, object_key=key)
        except ValueError as exc:
            with pytest.raises(ValueError, match=str(exc)):
                s3_dataset(bucket, key)
            continue
        assert s3_dataset(bucket, key) == (naming.get_namespace(), naming.get_name(), None)
        assert isinstance(s3_dataset(bucket, key), DatasetRef)


@pytest.mark.parametrize("key", ["", "   ", None])
def test_s3_dataset_refuses_an_empty_key_for_a_known_bucket(key):
    s3_dataset("known-bucket", "a")
    with pytest.raises(ValueError, match="object_key"):
        s3_dataset("known-bucket", key)


def test_uuid7_random_bits_are_all_random():
    # 74 random bits around the version and variant: each takes both values in 2,000 ids;
    # the version (bits 76-79) and variant (62-63) bits never change.
    ids = [_uuid7() for _ in range(2000)]
    ones = zeros = 0
    for value in ids:
        ones |= value
        zeros |= ~value
    for bit in range(76):
        both = bool(ones >> bit & 1) and bool(zeros >> bit & 1)
        assert both == (bit not in (62, 63)), bit


def test_the_fast_span_lookup_is_the_apis_answer():
    # The run helpers read the current span without the API's layers of calls; it must be
    # in force with this opentelemetry-api (else a third of a run's cost is back) and give
    # the API's answer in every place a handler's span can come from.
    import asyncio
    import contextvars

    from opentelemetry import context as otel_context
    from opentelemetry.sdk.trace import TracerProvider

    from outbox._run._runid import _current_span, _current_span_api

    assert _current_span is not _current_span_api
    tracer = TracerProvider().get_tracer("test")

    def same() -> bool:
        return _current_span() is trace.get_current_span()

    assert same()
    assert _current_span() is trace.INVALID_SPAN
    with tracer.start_as_current_span("outer") as outer:
        assert same()
        assert _current_span() is outer
        with tracer.start_as_current_span("inner") as inner:
            assert same()
            assert _current_span() is inner
        assert _current_span() is outer
        token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(SpanContext(5, 6, False))))
        assert same()
        assert _current_span().get_span_context().trace_id == 5
        otel_context.detach(token)
        assert _current_span() is outer
        # A copy of the context (a thread pool's, asyncio's tasks') carries the span along.
        assert contextvars.copy_context().run(_current_span) is outer

        async def in_a_task():
            return _current_span()

        assert asyncio.run(in_a_task()) is outer
    seen = []
    thread = threading.Thread(target=lambda: seen.append(same() and _current_span() is trace.INVALID_SPAN))
    thread.start()
    thread.join()
    assert seen == [True]


def test_another_runtime_context_gets_the_apis_own_lookup(monkeypatch):
    import opentelemetry.context

    from outbox._run._runid import _current_span_api, _span_lookup

    class Elsewhere:  # a runtime context chosen with OTEL_PYTHON_CONTEXT
        pass

    monkeypatch.setattr(opentelemetry.context, "_RUNTIME_CONTEXT", Elsewhere())
    assert _span_lookup() is _current_span_api


def test_a_number_run_id_is_written_right_for_every_run_however_many_interleave():
    """serialize writes a run id given as a number once per run (its events share the string),
    remembering the last few: runs that interleave, more of them than it remembers, each get
    their own id, in the body and as the event's run id."""
    job = LineageJob("ns", "job")
    values = [_uuid7() for _ in range(300)]
    starts = [RunRecord(job, "START", 1.5, value, (), ()) for value in values]
    completes = [RunRecord(job, "COMPLETE", 2.5, value, (), ()) for value in reversed(values)]
    for record in starts + completes + starts:
        ser = serialize(record)
        text = str(uuid.UUID(int=record.run_id))
        assert ser.run_id == text
        assert orjson.loads(ser.body)["run"]["runId"] == text
    again = serialize(completes[-1])  # the last run serialized: its text remembered
    assert again.run_id is serialize(starts[0]).run_id
