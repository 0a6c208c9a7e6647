"""The fast serializer produces the same JSON object as openlineage-python's Serde.to_json."""

import datetime
import decimal
import enum
import json
import logging
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

from outbox._serde import Unserializable, event_key, serialize


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


def test_big_integers_fall_back_to_the_stdlib_encoder():
    event = RunEvent(
        eventType=RunState.START,
        eventTime="2026-12-02T10:00:00+00:00",
        run=Run(runId=str(uuid.uuid4()), facets={"custom": CustomRunFacet(count=2**80)}),
        job=Job(namespace="n", name="j"),
    )
    same_as_serde(event)


# -- the values Serde accepts and refuses -------------------------------------------------------


class Opaque:
    pass


class Shade(enum.Enum):
    DARK = "dark"


class Ratio(float):
    pass


def _cycle() -> dict:
    loop: dict = {"name": "loop"}
    loop["self"] = loop
    return loop


REFUSED = "refused"
# value -> what the refusal says (None: accepted).  Each goes in a facet field of an event given
# as an openlineage-python RunEvent (Serde runs attr.asdict first) and as a dict (it does not).
VALUES = {
    "a set": ({"a"}, "a set at run.facets.custom.v"),
    "a frozenset": (frozenset([1]), "a set at run.facets.custom.v"),
    "a set in a list": ([1, {"a"}], "a set at run.facets.custom.v[1]"),
    "NaN": (float("nan"), "a NaN at run.facets.custom.v: JSON has no NaN"),
    "Infinity": (float("inf"), "an Infinity at run.facets.custom.v"),
    "-Infinity in a list": ([1.5, float("-inf")], "a -Infinity at run.facets.custom.v[1]"),
    "a float subclass NaN": (Ratio("nan"), "a NaN at run.facets.custom.v"),
    "NaN beside a 30-digit integer": ({"n": 10**30, "r": float("nan")}, "a NaN at run.facets.custom.v.r"),
    "a Decimal": (decimal.Decimal("1.10"), "a Decimal at run.facets.custom.v"),
    "bytes": (b"x", "a bytes value at run.facets.custom.v, which JSON cannot hold"),
    "an object()": (object(), "an object() at run.facets.custom.v"),
    "an object of a class": (Opaque(), "an Opaque object at run.facets.custom.v"),
    "a time": (datetime.time(10, 0), "a time object at run.facets.custom.v"),
    "a complex": (1j, "a complex object at run.facets.custom.v"),
    "keys of two types": ({1: "a", "b": 2}, "at run.facets.custom.v: keys of different types (int, str)"),
    "a tuple key": ({(1, 2): "a"}, "at run.facets.custom.v: a key of type tuple"),
    "a cycle": (_cycle(), "the event holds itself at run.facets.custom.v.self (a reference cycle)"),
    "int keys": ({2: "a", 10: "b"}, None),
    "a datetime without a timezone": (datetime.datetime(2026, 12, 2, 10, 0), None),
    "a datetime with one": (datetime.datetime(2026, 12, 2, 10, 0, tzinfo=datetime.UTC), None),
    "a date": (datetime.date(2026, 12, 2), None),
    "a UUID": (uuid.UUID(int=7), None),
    "an enum": (Shade.DARK, None),
    "a 30-digit integer": (123456789012345678901234567890, None),
    "nulls and empty objects in a list": ([None, {}, 1, {"a": None}], None),
    "text holding null tokens": ('{"a":null,"b":[null]}', None),
}


def serde_verdict(event) -> object:
    """What openlineage-python's Serde makes of ``event``: REFUSED when it raises, sends a
    placeholder in a value's place, or writes what is not JSON (NaN, Infinity); else the JSON
    object it writes."""

    def not_json(token: str) -> None:
        raise ValueError(token)

    try:
        text = Serde.to_json(event)
    except Exception:  # TypeError for keys, RecursionError for a cycle
        return REFUSED
    if "<<non-serializable: " in text:
        return REFUSED
    try:
        return json.loads(text, parse_constant=not_json)
    except ValueError:
        return REFUSED


def ours(event) -> object:
    try:
        return json.loads(serialize(event).body)  # (orjson reads a 30-digit integer as a float)
    except Unserializable:
        return REFUSED


def as_attrs(value) -> RunEvent:
    return RunEvent(
        eventType=RunState.START,
        eventTime="2026-12-02T10:00:00+00:00",
        run=Run(runId=str(uuid.UUID(int=1)), facets={"custom": {"v": value}}),
        job=Job(namespace="n", name="j"),
    )


def as_dict(value) -> dict:
    return {
        "eventType": "START",
        "eventTime": "2026-12-02T10:00:00+00:00",
        "run": {"runId": str(uuid.UUID(int=1)), "facets": {"custom": {"v": value}}},
        "job": {"namespace": "n", "name": "j"},
    }


@pytest.mark.parametrize("shape", [as_attrs, as_dict], ids=["RunEvent", "dict"])
@pytest.mark.parametrize("case", list(VALUES))
def test_the_same_values_are_accepted_and_refused_as_by_serde(case, shape):
    """Accepted: the same JSON object.  Refused: an ``Unserializable`` that says what, and
    where in the event.  A set is refused only in an event given as a dict: in an
    openlineage-python event ``attr.asdict`` makes it a list, as here."""
    value, said = VALUES[case]
    event = shape(value)
    theirs = serde_verdict(event)
    assert ours(event) == theirs
    if theirs != REFUSED:
        assert said is None or (shape is as_attrs and "a set" in said), case
        return
    assert said is not None, case
    with pytest.raises(Unserializable) as refused:
        serialize(event)
    assert said in str(refused.value)
    assert "openlineage-python" in str(refused.value)  # and what it would have done


def test_a_nan_in_a_facet_class_field_is_refused_by_name():
    """A float field of an attrs facet (checked apart from a dict's values): where Serde writes
    the bare token NaN, the outbox refuses the event and names the field."""
    event = as_attrs(None)
    event.run.facets = {"custom": CustomRunFacet(ratio=float("nan"), count=3)}
    assert "NaN" in Serde.to_json(event)
    with pytest.raises(Unserializable, match=r"^a NaN at run\.facets\.custom\.ratio: JSON has no NaN"):
        serialize(event)
    event.run.facets = {"custom": CustomRunFacet(ratio=0.25)}
    assert ours(event) == serde_verdict(event)


def test_an_attrs_object_in_a_dict_event_is_written_as_in_an_openlineage_python_event():
    """The one leniency: Serde sends "<<non-serializable: CustomRunFacet>>" for a facet object
    inside an event given as a dict; the outbox writes the facet as Serde writes it inside a
    RunEvent."""
    facet = CustomRunFacet(mapping={"k": "v"}, pairs=("a", "b"), color=Color.RED)
    event = as_dict(None)
    event["run"]["facets"] = {"custom": facet}
    reference = as_attrs(None)
    reference.run.facets = {"custom": facet}
    assert serde_verdict(event) == REFUSED
    written = ours(event)["run"]["facets"]["custom"]
    assert written == serde_verdict(reference)["run"]["facets"]["custom"]
    assert written["color"] == "red"


def test_a_datetime_without_a_timezone_is_written_as_serde_writes_it_with_a_warning(monkeypatch, caplog):
    from outbox import _refusals
    from outbox._log import RateLimitedLog

    monkeypatch.setattr(_refusals, "_log", RateLimitedLog(30.0))  # a fresh rate limit
    event = as_dict(datetime.datetime(2026, 12, 2, 10, 0))
    with caplog.at_level(logging.WARNING, logger="outbox"):
        assert ours(event)["run"]["facets"]["custom"]["v"] == "2026-12-02T10:00:00"
        ours(as_dict(datetime.datetime(2026, 12, 2, 10, 0, tzinfo=datetime.UTC)))
    assert serde_verdict(event)["run"]["facets"]["custom"]["v"] == "2026-12-02T10:00:00"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said  # the aware one says nothing
    assert "a datetime without a timezone (2026-12-02T10:00:00)" in said[0]
    assert "datetime.now(timezone.utc)" in said[0]


def test_an_event_that_cannot_be_serialized_is_counted_and_its_refusal_said(caplog, tmp_path):
    """What the refusal says reaches the log and the dead-letter file, and the event is
    counted invalid_event while the outbox delivers the rest."""
    from outbox import Outbox
    from outbox.transports import MemoryTransport

    dead = tmp_path / "dead.jsonl"
    with caplog.at_level(logging.WARNING, logger="outbox"):
        outbox = Outbox(MemoryTransport(), linger=0, dead_letter=dead, close_at_exit=False)
        assert outbox.emit(as_dict(float("nan")))
        assert outbox.emit(as_dict({"a"}))
        assert outbox.emit(as_dict(1.5))
        report = outbox.close(5)
    assert report.undelivered == {"invalid_event": 2}, report
    assert report.delivered == 1
    assert "cannot be serialized: a NaN at run.facets.custom.v: JSON has no NaN" in caplog.text
    answers = sorted(json.loads(line)["answer"] for line in dead.read_text().splitlines())
    assert answers[0].startswith("a NaN at run.facets.custom.v")
    assert answers[1].startswith("a set at run.facets.custom.v, which JSON cannot hold")


def test_a_run_helper_job_with_a_nan_is_refused_when_it_is_made():
    from outbox import LineageJob

    with pytest.raises(ValueError, match=r"a NaN at x\.ratio: JSON has no NaN"):
        LineageJob("n", "j", run_facets={"x": {"_producer": "p", "_schemaURL": "s", "ratio": float("nan")}})


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
