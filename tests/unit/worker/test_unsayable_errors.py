"""Exceptions from the application's objects whose message cannot be read (their __str__
raises), met where the sidecar formats them with an f-string instead of described()."""

import asyncio
import datetime
import time

from outbox import Outbox
from outbox._run._serde import serialize
from outbox.tools.sink import Sink
from outbox.transports import CompositeTransport, HttpTransport, OutcomeKind

from support.helpers import ScriptedTransport, run_event


class _Unsayable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no words")


class _UnsayableMember:
    """A failover chain's first member whose send raises an exception with no readable message."""

    def __init__(self) -> None:
        self.calls = 0

    async def send(self, events, deadline):
        self.calls += 1
        raise _Unsayable

    async def aclose(self) -> None:
        pass


def test_a_failover_member_raising_an_unsayable_error_does_not_keep_events_from_the_next():
    """composite._member_send formats the member's error with f"{exc}": that raised out of the
    composite's send, so the backup member was never tried and nothing was delivered."""
    backup = ScriptedTransport()
    transport = CompositeTransport(
        {"broken": _UnsayableMember(), "backup": backup}, continue_on_success=False
    )
    outbox = Outbox(transport, backoff_base=0.001, backoff_cap=0.002, linger=0.01, close_at_exit=False)
    for n in range(5):
        outbox.emit(run_event(n=n))
    try:
        assert outbox.flush(5)
        stats = outbox.stats()
        assert stats.delivered == 5
        assert len(backup.delivered) == 5
    finally:
        outbox.close(0.5)


class _UnsayableProvider:
    def get_bearer(self) -> str:
        raise _Unsayable


def test_a_token_provider_raising_an_unsayable_error_is_a_token_retry_not_a_raise():
    """provider_bearer promises NoBearer, never the provider's own exception; its f"{exc}" raised
    instead, out of HttpTransport.send (a transport that breaks its contract)."""
    with Sink() as sink:
        transport = HttpTransport(sink.url, token_provider=_UnsayableProvider())

        async def go():
            try:
                event = serialize(run_event(n=1))
                return await transport.send([event], time.monotonic() + 5)
            finally:
                await transport.aclose()

        outcomes = asyncio.run(go())
    assert [o.kind for o in outcomes] == [OutcomeKind.RETRY]
    assert outcomes[0].reason == "token"


class _OpenLineageTransport:
    """An openlineage-python transport whose emit of event n=1 raises an unsayable error."""

    def __init__(self) -> None:
        self.emitted: list[int] = []

    def emit(self, event) -> None:
        if event.get("n") == 1:
            raise _Unsayable
        self.emitted.append(event["n"])


def test_an_adapted_transport_raising_an_unsayable_error_does_not_resend_the_others_for_ever():
    """adapter.safe_failure does str(exc): that raised out of the adapter's send, so the whole
    batch came back RETRY; the events whose emit returned were answered DELIVERED from memory
    the next round, then emitted again the round after: thousands of duplicates, none counted."""
    from outbox.transports import OpenLineageTransportAdapter

    inner = _OpenLineageTransport()
    outbox = Outbox(
        OpenLineageTransportAdapter(lambda: inner),
        backoff_base=0.001,
        backoff_cap=0.002,
        linger=0.01,
        close_at_exit=False,
    )
    for n in range(10):
        outbox.emit(run_event(n=n))
    time.sleep(2)
    try:
        assert outbox.stats().delivered == 9
        assert sorted(inner.emitted) == [0, 2, 3, 4, 5, 6, 7, 8, 9]  # each once
    finally:
        outbox.close(0.5)


class _BadDate(datetime.date):
    """A facet value whose serialization raises an exception whose message cannot be read."""

    def isoformat(self) -> str:
        raise _Unsayable


def test_an_event_whose_error_cannot_say_what_it_is_is_counted_and_the_rest_go_on():
    """Describing the serializer's error raised again: the batch went back to the queue and the
    next take failed the same way, for ever (nothing delivered, every event lost at close)."""
    transport = ScriptedTransport()
    outbox = Outbox(transport, linger=0.01, close_at_exit=False)
    bad = run_event(n=1)
    bad["run"]["facets"]["x"] = {"_producer": "p", "_schemaURL": "s", "d": _BadDate(2020, 1, 1)}
    outbox.emit(run_event(n=0))
    outbox.emit(bad)
    for n in range(2, 50):
        outbox.emit(run_event(n=n))
    assert outbox.flush(5)
    stats = outbox.stats()
    assert stats.dropped == {"invalid_event": 1}
    assert stats.delivered == 49
    assert stats.offered == stats.delivered + stats.lost
    outbox.close(1)
