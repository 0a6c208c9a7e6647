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


class Outer:
    class Nested(Exception):
        pass


def _chained() -> BaseException:
    try:
        try:
            {}["missing"]
        except KeyError as key_error:
            raise ValueError("cannot read the row") from key_error
    except ValueError as error:
        return error
    raise AssertionError


def _grouped() -> BaseException:
    try:
        raise ExceptionGroup("two failed", [OSError("disk"), Outer.Nested("nested")])
    except ExceptionGroup as group:
        group.add_note("while processing bucket/key")
        return group


@pytest.mark.parametrize(
    "make", [_chained, _grouped, lambda: SyntaxError("bad", ("f.py", 3, 4, "x = = 1", 3, 5))]
)
def test_the_fail_says_what_format_exception_says_when_the_run_failed(make):
    """The FAIL's trace is taken where the run failed, without its frames, and formatted by the
    sidecar: the same text as ``traceback.format_exception``; and what the handler does with
    the exception afterwards (here: changes its message) does not change the FAIL."""
    import traceback

    transport = MemoryTransport()
    outbox = Outbox(transport, close_at_exit=False)
    error = make()
    with pytest.raises(type(error)), outbox.run(LineageJob("ns", "job")):
        raise error
    expected_trace, expected_message = "".join(traceback.format_exception(error)), str(error)
    error.args = ("changed afterwards",)
    assert outbox.flush(10)
    facet = transport.events[1]["run"]["facets"]["errorMessage"]
    assert facet["stackTrace"] == expected_trace
    assert facet["message"] == expected_message
    outbox.close(1)


class Payload:
    """What a failed invocation's frame held (a dataframe, a file's bytes)."""


def _fail_holding(outbox: Outbox, job: LineageJob, alive: list) -> None:
    import weakref

    payload = Payload()  # only this frame refers to it
    alive.append(weakref.ref(payload))
    with outbox.run(job):
        raise ValueError(f"cannot process {id(payload)}")


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_fail_waiting_in_the_buffer_holds_none_of_the_failed_frames(asynchronous):
    """While its FAIL waits to be sent (here: a batch that lingers), the failed invocation's
    frames and what they held are freed once the handler is done with the exception: an
    outage's backlog of FAILs must not hold every failed invocation's data."""
    import asyncio
    import gc

    transport = MemoryTransport()
    outbox = Outbox(transport, linger=60, close_at_exit=False)
    job = LineageJob("ns", "job")
    alive: list = []
    for _ in range(3):
        try:
            if asynchronous:

                async def body(alive: list = alive) -> None:
                    payload = Payload()
                    alive.append(__import__("weakref").ref(payload))
                    async with outbox.run(job):
                        raise ValueError("cannot process")

                asyncio.run(body())
            else:
                _fail_holding(outbox, job, alive)
        except ValueError:
            pass
    gc.collect()
    assert outbox.stats().queued_events == 6  # the STARTs and FAILs wait, unsent
    assert [ref() for ref in alive] == [None, None, None]
    assert outbox.flush(10)
    assert [event["eventType"] for event in transport.events] == ["START", "FAIL"] * 3
    assert all(
        "ValueError: cannot process" in e["run"]["facets"]["errorMessage"]["stackTrace"]
        for e in transport.events[1::2]
    )
    outbox.close(1)


class NotesRaise(Exception):
    @property
    def __notes__(self) -> list[str]:
        raise RuntimeError("the exception's own __notes__ fails")


class Unprintable:
    def __str__(self) -> str:
        raise ValueError("no text")


def _syntax_error_with_odd_lineno() -> BaseException:
    error = SyntaxError("bad")
    error.lineno = Unprintable()  # type: ignore[assignment]
    return error


class Row:
    """A row whose columns read as attributes: a missing one is a KeyError (a common mistake)."""

    def __init__(self) -> None:
        self.__dict__["columns"] = {}

    def __getattr__(self, name: str) -> object:
        return self.columns[name]

    def total(self) -> object:
        return totl  # type: ignore[name-defined]  # noqa: F821


def _name_error_in_a_method() -> BaseException:
    # 3.12+: traceback's "Did you mean" looks for the name on self (hasattr): Row's KeyError.
    try:
        Row().total()
    except NameError as error:
        return error
    raise AssertionError


@pytest.mark.parametrize("make", [NotesRaise, _syntax_error_with_odd_lineno, _name_error_in_a_method])
def test_the_handler_gets_its_own_exception_whatever_taking_its_trace_raises(make):
    """Taking the trace reads the exception (its notes, a SyntaxError's line, on 3.12+ the
    attributes a NameError's suggestion looks at): what that raises is not the handler's to get
    in place of its own exception, and the FAIL still reaches the backend."""
    transport = MemoryTransport()
    outbox = Outbox(transport, close_at_exit=False)
    error = make()
    try:
        with outbox.run(LineageJob("ns", "job")):
            raise error
    except BaseException as caught:  # (not pytest.raises: pytest cannot format these either)
        got = caught
    assert got is error, f"the handler got {type(got).__name__}"
    assert outbox.flush(10)
    assert [event["eventType"] for event in transport.events] == ["START", "FAIL"]
    assert type(error).__name__ in transport.events[1]["run"]["facets"]["errorMessage"]["stackTrace"]
    validate(transport.events[1])
    outbox.close(1)


class Collected(list):
    """An emitter that keeps what it is handed: the records, to be formatted when the test says."""

    def emit(self, event: object) -> bool:
        self.append(event)
        return True


def test_notes_added_after_the_run_failed_are_not_in_its_fail():
    """A handler (or a framework up the stack) that adds a note to the exception, or to its
    cause, while the FAIL waits in the buffer does not change what the FAIL says."""
    import json
    import traceback

    from outbox import Run

    records = Collected()
    error = _chained()
    error.add_note("while reading bucket/key")
    with pytest.raises(ValueError, match="row"), Run(records, LineageJob("ns", "job")):  # type: ignore[arg-type]
        raise error
    expected = "".join(traceback.format_exception(error))
    error.add_note("while handling request 17")
    assert error.__cause__ is not None
    error.__cause__.add_note("seen by the retry")
    facet = json.loads(records[1].to_json())["run"]["facets"]["errorMessage"]
    assert facet["stackTrace"] == expected


class Text(str):
    """A message that is text of its own kind (a markup string, a lazily translated one)."""

    def __len__(self) -> int:
        raise TypeError("lazy text has no length until rendered")


class LazyMessage(BaseException):
    def __str__(self) -> str:
        return Text("cannot process bucket/key")


def _syntax_error_with_bytes_text() -> BaseException:
    # What a parser that works on bytes may raise: the offending line as it read it.
    return SyntaxError("bad", ("f.py", 3, 4, b"x = = 1", 3, 5))


@pytest.mark.parametrize("make", [LazyMessage, _syntax_error_with_bytes_text])
def test_the_fail_reaches_the_backend_whatever_formatting_its_trace_raises(make):
    """The sidecar formats the trace: an exception it cannot format (traceback cannot either)
    still ends its run with a valid FAIL, not an invalid_event and a run the backend shows
    running forever."""
    transport = MemoryTransport()
    outbox = Outbox(transport, close_at_exit=False)
    error = make()
    with pytest.raises(type(error)), outbox.run(LineageJob("ns", "job")):
        raise error
    assert outbox.flush(10)
    assert outbox.stats().dropped == {}
    assert [event["eventType"] for event in transport.events] == ["START", "FAIL"]
    facet = transport.events[1]["run"]["facets"]["errorMessage"]
    assert type(error).__name__ in facet["stackTrace"]
    assert facet["message"]
    validate(transport.events[1])
    outbox.close(1)
