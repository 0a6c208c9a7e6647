"""Pacing (``outbox._worker._retry``): the one bounded backoff, the pacing of a close, the breaker.  Also
the sender's check of a transport's answer (``outbox._worker._sender``) and how the Kafka transport
says what its errors are about."""

from __future__ import annotations

import random

import pytest
from aiokafka import errors as kafka_errors

from outbox import About, Outcome
from outbox._observability._log import RateLimitedLog
from outbox._worker._retry import (
    CLOSE_BACKOFF_CAP,
    LAST_ATTEMPT_LEAD,
    MIN_CLOSE_GAP,
    Breaker,
    CircuitState,
    backoff_delay,
    close_paced,
)
from outbox._worker._sender import checked, classify
from outbox.transports import KafkaTransport


@pytest.mark.parametrize("attempt", [1, 2, 10, 63, 1025, 10_000, 10**6])
def test_the_backoff_is_bounded_for_any_attempt(attempt):
    random.seed(attempt)
    assert 0.0 <= backoff_delay(attempt, 0.1, 30.0) <= 30.0
    assert backoff_delay(attempt, 0.1, 30.0, retry_after=45.0) == 45.0


def test_a_close_paces_attempts_within_its_deadline():
    # Far from the deadline: at most a second.
    assert close_paced(30.0, now=0.0, deadline=10.0) == CLOSE_BACKOFF_CAP
    # Near it: the last attempt starts LAST_ATTEMPT_LEAD before it, never closer than the gap.
    assert close_paced(5.0, now=0.0, deadline=0.75) == pytest.approx(0.75 - LAST_ATTEMPT_LEAD)
    assert close_paced(5.0, now=0.0, deadline=0.2) == MIN_CLOSE_GAP
    assert close_paced(0.05, now=0.0, deadline=10.0) == 0.05  # a short wait stays as it is


def test_the_breaker_opens_after_the_threshold_probes_half_open_and_closes_on_success():
    random.seed(1)
    breaker = Breaker(threshold=3, base=0.1, cap=1.0)
    assert not breaker.failing
    assert breaker.next_attempt(0.0) == 0.0
    for i in range(3):
        delay = breaker.failed(float(i))
        assert 0.0 <= delay <= 1.0
    assert breaker.circuit is CircuitState.OPEN
    at = breaker.next_attempt(2.0)
    assert at >= 2.0
    breaker.started(at)
    assert breaker.circuit is CircuitState.HALF_OPEN
    breaker.failed(at)
    assert breaker.circuit is CircuitState.OPEN
    breaker.succeeded()
    assert breaker.circuit is CircuitState.CLOSED
    assert not breaker.failing


def test_a_close_gives_the_failing_backend_one_immediate_attempt_then_paced_ones():
    random.seed(2)
    breaker = Breaker(threshold=5, base=10.0, cap=30.0)
    breaker.failed(0.0)
    breaker.failed(0.0)
    breaker.begin_close(deadline=3.0)
    assert breaker.next_attempt(0.5) == 0.5  # the last chance, at once
    breaker.started(0.5)
    breaker.failed(0.6)
    assert breaker.next_attempt(0.6) <= 0.6 + CLOSE_BACKOFF_CAP  # paced within the deadline


def test_an_answer_out_of_contract_is_a_retry_about_the_backend_for_the_whole_batch():
    log = RateLimitedLog(30.0)
    assert (
        checked(None, 2, "t", log)
        == [Outcome.retry("transport_error", "'t'.send returned NoneType, not a sequence of Outcomes")] * 2
    )
    wrong_count = checked([Outcome.delivered()], 2, "t", log)
    assert all(o.reason == "transport_error" and o.about is About.BACKEND for o in wrong_count)
    bad_wait = checked([Outcome.retry("x", retry_after=-1.0)], 1, "t", log)
    assert bad_wait[0].retry_after is None


def test_a_verdict_says_what_an_answer_is_about():
    verdict = classify(
        [
            Outcome.delivered(),
            Outcome.retry("http_500", "cannot map", about=About.EVENT),
            Outcome.rejected("rejected_by_backend", "400"),
            Outcome.deferred(),
        ]
    )
    assert verdict.delivered == 1
    assert verdict.retries == 1
    assert verdict.lost == {"rejected_by_backend": 1}
    assert verdict.moved
    assert not verdict.about_backend
    down = classify([Outcome.retry("http_503", "down", retry_after=2.0)] * 3)
    assert down.about_backend
    assert down.retry_after == 2.0
    assert down.backend_retries == 3


def test_http_5xx_that_may_be_about_the_event_and_those_about_the_backend():
    """Marquez, OpenMetadata and DataHub answer 500 to an event they cannot map: a poison
    suspect.  502, 503 and 504 say the backend (or the way to it) is down."""
    import httpx

    from outbox.transports._http._answers import status_outcome

    def meaning(response: httpx.Response, url: str, events: int = 1) -> Outcome:
        """What HttpTransport, with its defaults, makes of a non-2xx answer."""
        return status_outcome(response, url, "", events=events, forcelist=None, retry_statuses=frozenset())[0]

    response = httpx.Response(500, request=httpx.Request("POST", "http://127.0.0.1:9/api/v1/lineage/batch"))
    assert meaning(response, "batch", events=10).about is About.REQUEST  # which one?
    for status, about in (
        (500, About.EVENT),
        (501, About.EVENT),
        (502, About.BACKEND),
        (503, About.BACKEND),
        (504, About.BACKEND),
        (429, About.BACKEND),
        (408, About.BACKEND),
    ):
        response = httpx.Response(status, request=httpx.Request("POST", "http://127.0.0.1:9/api/v1/lineage"))
        outcome = meaning(response, "http://127.0.0.1:9/api/v1/lineage")
        assert outcome.about is about, status


@pytest.mark.parametrize(
    ("error", "kind", "about"),
    [
        (kafka_errors.CorruptRecordException, "retry", About.EVENT),
        (kafka_errors.InvalidMessageError, "retry", About.EVENT),
        (kafka_errors.InvalidTimestampError, "retry", About.EVENT),
        (kafka_errors.RecordTooLargeError, "rejected", None),
        (kafka_errors.MessageSizeTooLargeError, "rejected", None),
        (kafka_errors.NotLeaderForPartitionError, "retry", About.BACKEND),
        (kafka_errors.KafkaConnectionError, "retry", About.BACKEND),
        (kafka_errors.RequestTimedOutError, "retry", About.BACKEND),
    ],
)
def test_kafka_record_errors_are_about_the_records_and_broker_errors_about_the_broker(error, kind, about):
    """Kafka's record-level errors (too large, invalid or corrupt records) are handled as such:
    too large is settled at once, an invalid or corrupt record is a poison suspect; the
    broker's errors are about the broker."""
    transport = KafkaTransport("t", {"bootstrap.servers": "127.0.0.1:9"})
    outcome = transport._outcome(error())
    assert outcome.kind.value == kind
    if about is not None:
        assert outcome.about is about
    if about is About.EVENT:  # a producer batch of several records: one of them, not which
        assert transport._outcome(error(), records=3).about is About.REQUEST
