"""What a run's body raises, and the run id a caller gives, never cost the run its events: the
FAIL of any exception the handler raises reaches the backend, valid against the OpenLineage
spec and within the batch's bytes; a run id that is no UUID is refused where it is given."""

import os
import uuid

import pytest

from outbox import LineageJob, Outbox, s3_dataset
from outbox.transports import MemoryTransport

from support.spec import validate


class StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("the exception's own __str__ fails")


class StrNotText(Exception):
    def __str__(self) -> str:
        return 42  # type: ignore[return-value]


class HugeStr(Exception):
    def __str__(self) -> str:
        return "x" * 10_000_000


# What a handler may raise: its message unprintable, not text, a file name decoded with
# surrogateescape (a Latin-1 name on a UTF-8 system), or ten megabytes long.
ERRORS = {
    "str_raises": lambda: StrRaises("a"),
    "str_not_text": lambda: StrNotText("a"),
    "surrogates": lambda: ValueError(f"cannot parse {os.fsdecode(b'caf' + bytes([0xE9]) + b'.csv')}"),
    "huge": lambda: HugeStr(),
}


@pytest.mark.parametrize("kind", list(ERRORS))
def test_the_fail_of_any_exception_reaches_the_backend(kind):
    transport = MemoryTransport()
    outbox = Outbox(transport, close_at_exit=False)
    job = LineageJob("ns", "job")
    error = ERRORS[kind]()
    with pytest.raises(type(error)) as raised, outbox.run(job, inputs=[s3_dataset("bucket", "key")]):
        raise error
    assert raised.value is error  # re-raised unchanged
    assert outbox.flush(10)
    assert outbox.stats().dropped == {}
    assert [event["eventType"] for event in transport.events] == ["START", "FAIL"]
    facet = transport.events[1]["run"]["facets"]["errorMessage"]
    assert facet["programmingLanguage"] == "python"
    assert facet["message"]
    assert type(error).__name__ in facet["stackTrace"]
    assert len(facet["message"]) + len(facet["stackTrace"]) < 1_000_000
    validate(transport.events[1])  # the spec's RunEvent, and its errorMessage facet's schema
    outbox.close(1)


@pytest.mark.parametrize("run_id", ["not-a-uuid", "1234", uuid.uuid4(), 12345])
def test_a_run_id_that_is_no_uuid_is_refused_where_it_is_given(run_id):
    # openlineage-python's Run refuses it when made; the spec's runId is a UUID: shipped, it is
    # an event every backend refuses, the run's whole lineage lost in the sidecar.
    outbox = Outbox(MemoryTransport(), close_at_exit=False)
    job = LineageJob("ns", "job")
    with pytest.raises((ValueError, TypeError), match="run_id"):
        outbox.run(job, inputs=[s3_dataset("bucket", "key")], run_id=run_id)
    assert outbox.stats().emitted == 0
    upper = str(uuid.uuid4()).upper()  # a UUID in capitals is one: kept as given
    with outbox.run(job, run_id=upper) as run:
        assert run.run_id == upper
    outbox.close(1)
