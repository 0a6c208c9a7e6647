"""The fast serializer produces the same JSON object as openlineage-python's Serde.to_json."""

import datetime
import enum
import json
import uuid
import warnings

import attr
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openlineage.client.event_v2 import (
    DatasetEvent,
    InputDataset,
    Job,
    JobEvent,
    OutputDataset,
    Run,
    RunEvent,
    RunState,
    StaticDataset,
)
from openlineage.client.facet_v2 import (
    RunFacet,
    error_message_run,
    job_type_job,
    parent_run,
    schema_dataset,
    sql_job,
)
from openlineage.client.serde import Serde

from outbox._serde import event_key, serialize


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@attr.define
class Inner:
    label: str | None = None
    tags: list[str | None] | None = None


@attr.define
class CustomRunFacet(RunFacet):
    """A user's own facet: nested attrs, enums, tuples, UUIDs, dates, None everywhere."""

    count: int | None = None
    ratio: float | None = None
    flag: bool | None = None
    color: Color | None = None
    inner: Inner | None = None
    items: list[Inner | None] = attr.field(factory=list)
    pairs: tuple[str, ...] = ()
    mapping: dict[str, str | None] = attr.field(factory=dict)
    ident: uuid.UUID | None = None
    when: datetime.datetime | None = None


text = st.text(max_size=12)  # any unicode, including surrogates-free astral characters
maybe_text = st.none() | text
finite = st.floats(allow_nan=False, allow_infinity=False)
inner = st.builds(Inner, label=maybe_text, tags=st.none() | st.lists(maybe_text, max_size=3))
custom = st.builds(
    CustomRunFacet,
    count=st.none() | st.integers(-(2**63), 2**63 - 1),
    ratio=st.none() | finite,
    flag=st.none() | st.booleans(),
    color=st.none() | st.sampled_from(Color),
    inner=st.none() | inner,
    items=st.lists(st.none() | inner, max_size=3),
    pairs=st.tuples(text, text),
    mapping=st.dictionaries(text, maybe_text, max_size=3),
    ident=st.none() | st.uuids(),
    when=st.none() | st.datetimes(timezones=st.just(datetime.UTC)),
)
error = st.builds(
    error_message_run.ErrorMessageRunFacet,
    message=text,
    programmingLanguage=st.just("python"),
    stackTrace=maybe_text,
)
parent = st.builds(
    parent_run.ParentRunFacet,
    run=st.builds(parent_run.Run, runId=st.uuids().map(str)),
    job=st.builds(parent_run.Job, namespace=text, name=text),
    root=st.none()
    | st.builds(
        parent_run.Root,
        run=st.builds(parent_run.RootRun, runId=st.uuids().map(str)),
        job=st.builds(parent_run.RootJob, namespace=text, name=text),
    ),
)
run_facets = st.fixed_dictionaries(
    {}, optional={"errorMessage": error, "custom": custom, "parent": parent, "nothing": st.none()}
)
schema = st.builds(
    schema_dataset.SchemaDatasetFacet,
    fields=st.lists(
        st.builds(
            schema_dataset.SchemaDatasetFacetFields, name=text, type=maybe_text, description=maybe_text
        ),
        max_size=3,
    ),
)
datasets_in = st.lists(
    st.builds(
        InputDataset,
        namespace=text,
        name=text,
        facets=st.none() | st.fixed_dictionaries({}, optional={"schema": schema}),
    ),
    max_size=3,
)
datasets_out = st.lists(st.builds(OutputDataset, namespace=text, name=text), max_size=2)
job_facets = st.fixed_dictionaries(
    {},
    optional={
        "jobType": st.builds(
            job_type_job.JobTypeJobFacet,
            processingType=st.sampled_from(["BATCH", "STREAMING"]),
            integration=text,
            jobType=maybe_text,
        ),
        "sql": st.builds(sql_job.SQLJobFacet, query=text),
    },
)
jobs = st.builds(Job, namespace=text, name=text, facets=job_facets)
times = st.datetimes(timezones=st.just(datetime.UTC)).map(lambda d: d.isoformat())
run_events = st.builds(
    RunEvent,
    eventType=st.none() | st.sampled_from(RunState),
    eventTime=times,
    run=st.builds(Run, runId=st.uuids().map(str), facets=st.none() | run_facets),
    job=jobs,
    producer=st.just("https://example.com/p"),
    inputs=st.none() | datasets_in,
    outputs=st.none() | datasets_out,
)
job_events = st.builds(JobEvent, eventTime=times, job=jobs, inputs=datasets_in, outputs=datasets_out)
dataset_events = st.builds(
    DatasetEvent, eventTime=times, dataset=st.builds(StaticDataset, namespace=text, name=text)
)


def same_as_serde(event) -> None:
    expected = json.loads(Serde.to_json(event))
    actual = orjson.loads(serialize(event).body)
    assert actual == expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run_events)
def test_run_events_match_serde(event):
    same_as_serde(event)


@settings(max_examples=100, deadline=None)
@given(st.one_of(job_events, dataset_events))
def test_job_and_dataset_events_match_serde(event):
    same_as_serde(event)


def test_additional_properties_and_legacy_classes_match_serde():
    facet = error_message_run.ErrorMessageRunFacet(
        message="m", programmingLanguage="python"
    ).with_additional_properties(extra={"a": None, "b": [None, {}, 1]})
    event = RunEvent(
        eventType=RunState.FAIL,
        eventTime="2026-12-02T10:00:00+00:00",
        run=Run(runId=str(uuid.uuid4()), facets={"errorMessage": facet}),
        job=Job(namespace="n", name="j"),
    )
    same_as_serde(event)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from openlineage.client import facet as legacy_facet
        from openlineage.client import run as legacy

    legacy_event = legacy.RunEvent(
        legacy.RunState.START,
        "2026-12-02T10:00:00+00:00",
        legacy.Run(
            str(uuid.uuid4()),
            facets={"nominalTime": legacy_facet.NominalTimeRunFacet("2026-12-02T10:00:00Z")},
        ),
        legacy.Job("n", "j"),
        "p",
        inputs=[legacy.Dataset("s3://b", "k")],
    )
    same_as_serde(legacy_event)


def test_a_value_json_cannot_hold_raises_where_serde_writes_a_placeholder():
    from openlineage.client.serde import Serde

    from outbox._serde import Unserializable

    class Opaque:
        pass

    facet = CustomRunFacet(mapping={"x": Opaque()})  # type: ignore[dict-item]
    event = RunEvent(
        eventType=RunState.START,
        eventTime="2026-12-02T10:00:00+00:00",
        run=Run(runId=str(uuid.uuid4()), facets={"custom": facet}),
        job=Job(namespace="n", name="j"),
    )
    assert "<<non-serializable: " in Serde.to_json(event)  # what we refuse to send
    with pytest.raises(Unserializable, match=r"holds a .*Opaque, which JSON cannot hold"):
        serialize(event)


def test_big_integers_fall_back_to_the_stdlib_encoder():
    event = RunEvent(
        eventType=RunState.START,
        eventTime="2026-12-02T10:00:00+00:00",
        run=Run(runId=str(uuid.uuid4()), facets={"custom": CustomRunFacet(count=2**80)}),
        job=Job(namespace="n", name="j"),
    )
    same_as_serde(event)


def test_non_finite_floats_are_written_as_null():
    # Serde writes the bare token NaN, which is not JSON; we write null on purpose.
    event = RunEvent(
        eventType=RunState.START,
        eventTime="2026-12-02T10:00:00+00:00",
        run=Run(runId=str(uuid.uuid4()), facets={"custom": CustomRunFacet(ratio=float("nan"))}),
        job=Job(namespace="n", name="j"),
    )
    body = serialize(event).body
    assert orjson.loads(body)["run"]["facets"]["custom"]["ratio"] is None
    assert b"NaN" in Serde.to_json(event).encode()


@pytest.mark.parametrize(
    ("plain", "key"),
    [
        ({"run": {"runId": "r"}, "job": {"namespace": "ns", "name": "j"}}, "run:ns/j"),
        (
            {
                "run": {"facets": {"parent": {"job": {"namespace": "pns", "name": "pj"}}}},
                "job": {"namespace": "ns", "name": "j"},
            },
            "run:pns/pj",
        ),
        (
            {
                "run": {
                    "facets": {
                        "parent": {
                            "job": {"namespace": "pns", "name": "pj"},
                            "root": {"job": {"namespace": "rns", "name": "rj"}},
                        }
                    }
                },
                "job": {"namespace": "ns", "name": "j"},
            },
            "run:rns/rj",
        ),
        (
            {
                "run": {"facets": {"parent": {"job": {"namespace": "", "name": "pj"}}}},
                "job": {"namespace": "ns", "name": "j"},
            },
            "run:ns/j",
        ),
        ({"job": {"namespace": "ns", "name": "j"}}, "job:ns/j"),
        ({"dataset": {"namespace": "s3://b", "name": "k"}}, "dataset:s3://b/k"),
        ({"eventType": "START"}, None),
    ],
)
def test_message_keys_follow_openlineage_python(plain, key):
    assert event_key(plain) == key


def test_serialized_event_carries_run_id_and_key():
    run_id = str(uuid.uuid4())
    event = RunEvent(
        eventType=RunState.START,
        eventTime="2026-12-02T10:00:00+00:00",
        run=Run(runId=run_id),
        job=Job(namespace="ns", name="j"),
    )
    ser = serialize(event)
    assert ser.run_id == run_id
    assert ser.key == "run:ns/j"
    text_in = serialize(ser.body.decode())
    assert text_in == ser


def test_key_matches_openlineage_python_kafka_transport():
    from openlineage.client.transport.kafka import KafkaTransport

    events = [
        RunEvent(
            eventType=RunState.START,
            eventTime="2026-12-02T10:00:00+00:00",
            run=Run(runId=str(uuid.uuid4()), facets=facets),
            job=Job(namespace="ns", name="j"),
        )
        for facets in (
            {},
            {
                "parent": parent_run.ParentRunFacet(
                    run=parent_run.Run(runId=str(uuid.uuid4())),
                    job=parent_run.Job(namespace="pns", name="pj"),
                )
            },
            {
                "parent": parent_run.ParentRunFacet(
                    run=parent_run.Run(runId=str(uuid.uuid4())),
                    job=parent_run.Job(namespace="pns", name="pj"),
                    root=parent_run.Root(
                        run=parent_run.RootRun(runId=str(uuid.uuid4())),
                        job=parent_run.RootJob(namespace="rns", name="rj"),
                    ),
                )
            },
        )
    ]
    events.append(JobEvent(eventTime="2026-12-02T10:00:00+00:00", job=Job(namespace="ns", name="j")))
    events.append(
        DatasetEvent(eventTime="2026-12-02T10:00:00+00:00", dataset=StaticDataset(namespace="d", name="t"))
    )
    reference = KafkaTransport.__new__(KafkaTransport)  # only its key logic; no producer
    for event in events:
        assert serialize(event).key == reference._get_message_key(event)


def test_run_helpers_with_run_facets_match_serde():
    """A LineageJob's run facets (processing_engine, for DataHub) on every event: the JSON is
    what openlineage-python writes for the equivalent RunEvent."""
    from openlineage.client.facet_v2 import processing_engine_run

    from outbox import LineageJob, s3_dataset
    from outbox._run import RunRecord

    engine = processing_engine_run.ProcessingEngineRunFacet(
        version="5.3", name="VAST_DATAENGINE", openlineageAdapterVersion="0.1.0"
    )
    job_type = job_type_job.JobTypeJobFacet(
        processingType="STREAMING", integration="VAST", jobType="FUNCTION"
    )
    job = LineageJob(
        "ns",
        "j",
        facets={"jobType": job_type},
        producer="https://example.com/p",
        run_facets={"processing_engine": engine},
    )
    run_id = str(uuid.uuid4())
    record = RunRecord(job, "COMPLETE", 1_764_669_600.0, run_id, (s3_dataset("b", "k"),), ())
    reference = RunEvent(
        eventType=RunState.COMPLETE,
        eventTime=datetime.datetime.fromtimestamp(1_764_669_600.0, datetime.UTC).isoformat(),
        run=Run(runId=run_id, facets={"processing_engine": engine}),
        job=Job(namespace="ns", name="j", facets={"jobType": job_type}),
        producer="https://example.com/p",
        inputs=[InputDataset(namespace="s3://b", name="k")],
        outputs=[],
    )
    assert orjson.loads(serialize(record).body) == json.loads(Serde.to_json(reference))
    assert (
        orjson.loads(serialize(record).body)["run"]["facets"]["processing_engine"]["name"]
        == "VAST_DATAENGINE"
    )
