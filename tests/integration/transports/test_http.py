"""The HTTP transport against real servers on loopback: the sink, and a proxy that misbehaves."""

import logging
import math
import time
import uuid

import pytest

from outbox import Outbox
from outbox.tools.faultproxy import FaultProxy, free_port
from outbox.tools.sink import Sink
from outbox.transports import HttpTransport
from outbox.transports.http import _SINGLE_SLICE, parse_retry_after, redact_url

import support.spec as spec
from support import parts
from support.chaos import running_time
from support.helpers import run_event, wait_until

FAST = {"backoff_base": 0.01, "backoff_cap": 0.05, "linger": 0.01, "close_at_exit": False}


@pytest.fixture
def sink():
    with Sink() as server:
        yield server


def outbox_for(url: str, **kw) -> Outbox:
    transport_kw = {k: kw.pop(k) for k in list(kw) if k in HttpTransport.__init__.__kwdefaults__}
    return Outbox(HttpTransport(url, **transport_kw), **{**FAST, **kw})


def accounting_is_exact(outbox: Outbox) -> None:
    stats = outbox.stats()
    assert stats.offered == stats.delivered + stats.lost + stats.queued_events + stats.in_flight


@pytest.mark.parametrize("mode", ["single", "batch", "auto"])
def test_healthy_backend_gets_every_event_in_order(sink, mode):
    outbox = outbox_for(sink.url, mode=mode)
    for i in range(300):
        outbox.emit(run_event(run_id="11111111-1111-1111-1111-111111111111", n=i))
    report = outbox.close(60)  # ends once all are delivered (single mode: 239 of 300 in 10 s under load)
    assert report.complete
    assert [e["n"] for e in sink.events] == list(range(300))
    paths = {path for path, _, _ in sink.requests}
    assert paths == ({"/api/v1/lineage"} if mode == "single" else {"/api/v1/lineage/batch"})


def test_single_mode_rejects_only_the_bad_event(sink):
    outbox = outbox_for(sink.url, mode="single")
    bad = run_event(n=1)
    bad["run"]["runId"] = "not-a-uuid"
    for event in (run_event(n=0), bad, run_event(n=2)):
        outbox.emit(event)
    report = outbox.close(5)
    assert report.delivered == 2
    assert report.undelivered == {"rejected_by_backend": 1}
    assert "run.runId 'not-a-uuid' must be a UUID" in (outbox.stats().last_error or "")
    assert sorted(e["n"] for e in sink.events) == [0, 2]


def test_batch_with_spec_body_rejects_only_the_bad_event(sink):
    outbox = outbox_for(sink.url, mode="batch")
    events = [run_event(n=i) for i in range(10)]
    del events[4]["job"]["name"]
    for event in events:
        outbox.emit(event)
    report = outbox.close(5)
    assert report.delivered == 9
    assert report.undelivered == {"rejected_by_backend": 1}
    assert len(sink.requests) == 1  # the partial_success body said which one


def test_batch_400_without_body_is_bisected(sink):
    sink.behaviour.batch_errors = "whole"
    outbox = outbox_for(sink.url, mode="batch", max_batch_events=16, linger=0.2)
    events = [run_event(n=i) for i in range(16)]
    events[5]["eventTime"] = "yesterday"
    for event in events:
        outbox.emit(event)
    report = outbox.close(5)
    assert report.delivered == 15
    assert report.undelivered == {"rejected_by_backend": 1}
    assert sorted(e["n"] for e in sink.events) == [i for i in range(16) if i != 5]
    # Bisection: log2(16) + 1 levels, two requests per level below the top.
    assert len(sink.requests) <= 1 + 2 * 4
    resent = sum(count for _, status, count in sink.requests) - 16
    assert resent <= 16 * 4


def test_partial_success_retries_only_the_retriable_events(sink):
    sink.behaviour.flaky_events = 3
    outbox = outbox_for(sink.url, mode="batch", linger=0.1)
    for i in range(10):
        outbox.emit(run_event(n=i))
    report = outbox.close(5)
    assert report.complete
    assert report.delivered == 10
    assert outbox.stats().retried == 3
    assert sorted(e["n"] for e in sink.events) == list(range(10))
    assert [count for _, _, count in sink.requests] == [10, 3]


def test_413_splits_the_batch_and_a_single_oversized_event_is_too_large(sink):
    big = run_event(n=99)
    big["run"]["facets"]["pad"] = {"x": "y" * 5000}
    sink.behaviour.max_body = 4000
    outbox = outbox_for(sink.url, mode="batch", max_batch_events=20, linger=0.2)
    for i in range(20):
        outbox.emit(run_event(n=i))
    outbox.emit(big)
    report = outbox.close(10)
    assert report.delivered == 20
    assert report.undelivered == {"too_large": 1}
    assert sorted(e["n"] for e in sink.events) == list(range(20))
    assert any(status == 413 for _, status, _ in sink.requests)


def test_single_event_413_is_too_large(sink):
    sink.behaviour.max_body = 1000
    outbox = outbox_for(sink.url, mode="single")
    big = run_event()
    big["run"]["facets"]["pad"] = {"x": "y" * 2000}
    outbox.emit(big)
    outbox.emit(run_event())
    report = outbox.close(5)
    assert report.undelivered == {"too_large": 1}
    assert report.delivered == 1


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_retriable_statuses_are_retried(sink, status):
    sink.behaviour.fail_status = status
    outbox = outbox_for(sink.url, mode="auto")
    outbox.emit(run_event())
    assert wait_until(lambda: len(sink.requests) >= 2, 5)
    assert outbox.stats().delivered == 0
    assert f"answered {status}" in (outbox.stats().last_error or "")
    sink.behaviour.fail_status = None
    assert outbox.flush(5)
    assert outbox.close(1).complete


@pytest.mark.parametrize("retry_after", ["0.6", "HTTP-DATE"])
def test_retry_after_is_honoured(sink, retry_after):
    # The retry may not come before the time the answer named: at least 0.6 s after the 429
    # (itself after the emit), or not before the date.  Bounds that hold however late this
    # thread sees the requests on a busy machine; without Retry-After the retry would come
    # after backoff_cap (1 ms).
    not_before = time.time() + 0.6
    if retry_after == "HTTP-DATE":
        import email.utils

        retry_after = email.utils.formatdate(time.time() + 1.6, usegmt=True)  # whole seconds: 0.6..1.6 s
        not_before = email.utils.parsedate_to_datetime(retry_after).timestamp()
    sink.behaviour.fail_status = 429
    sink.behaviour.retry_after = retry_after
    outbox = outbox_for(sink.url, mode="single", backoff_base=0.001, backoff_cap=0.001)
    outbox.emit(run_event())
    assert wait_until(lambda: len(sink.requests) >= 1, 5)
    sink.behaviour.fail_status = None
    assert sink.wait_for(1, 5)
    assert time.time() >= not_before
    outbox.close(1)


def test_connection_refused_then_backend_comes_up():
    port = free_port()
    outbox = outbox_for(f"http://127.0.0.1:{port}", mode="auto")
    for i in range(5):
        outbox.emit(run_event(n=i))
    assert wait_until(lambda: outbox.stats().retried >= 10, 5)
    assert "ConnectError" in (outbox.stats().last_error or "")
    with Sink(port=port) as sink:
        assert sink.wait_for(5, 10)
        assert outbox.close(5).complete
    accounting_is_exact(outbox)


def test_reset_mid_response_is_retried(sink):
    with FaultProxy("127.0.0.1", sink.port, mode="reset", reset_after=10) as proxy:
        outbox = outbox_for(proxy.url, mode="single")
        outbox.emit(run_event())
        assert wait_until(lambda: outbox.stats().retried >= 2, 5)
        assert "network" in (outbox.stats().last_error or "") or "failed" in (outbox.stats().last_error or "")
        proxy.mode = "pass"
        assert outbox.flush(5)
        report = outbox.close(1)
    assert report.complete
    # The reset came after the sink had the event: at-least-once, so it may hold duplicates.
    assert len(sink.events) >= 1


def test_a_garbled_answer_is_retried_and_a_trickled_one_is_read(sink):
    """The fault proxy's ``garble`` (the chaos test's backend of that name): each connection in
    turn gets the sink's own answer a byte at a time (read: delivered), a malformed chunk then a
    reset, or bytes that are no HTTP (each a network retry, the events kept)."""
    with FaultProxy("127.0.0.1", sink.port, mode="garble") as proxy:
        outbox = outbox_for(proxy.url, mode="single", backoff_base=0.01, backoff_cap=0.05)
        for _ in range(6):
            outbox.emit(run_event())
        assert outbox.flush(10)
        stats = outbox.stats()
        assert stats.delivered == 6
        assert stats.retried >= 1
        assert proxy.connections >= 3
        report = outbox.close(1)
    assert report.complete
    assert len({e["run"]["runId"] for e in sink.events}) == 6  # (a garbled answer's event may come twice)


def test_blackholed_backend_times_out_and_is_retried(sink):
    with FaultProxy("127.0.0.1", sink.port, mode="blackhole") as proxy:
        outbox = outbox_for(proxy.url, mode="single", timeout=0.3)
        outbox.emit(run_event())
        assert wait_until(lambda: outbox.stats().retried >= 1, 5)
        assert "timed out" in (outbox.stats().last_error or "") or "longer than" in (
            outbox.stats().last_error or ""
        )
        proxy.mode = "pass"
        assert outbox.flush(5)
        assert outbox.close(1).complete


def test_close_keeps_its_deadline_while_the_backend_blackholes(sink):
    with FaultProxy("127.0.0.1", sink.port, mode="blackhole") as proxy:
        outbox = outbox_for(proxy.url, timeout=30.0, send_timeout=60.0)
        for i in range(50):
            outbox.emit(run_event(n=i))
        # A request is in the black hole (not "0.1 s later": beside load, not always yet).
        assert wait_until(lambda: proxy.connections >= 1, 10)
        report, took = running_time(lambda: outbox.close(1.0))  # the time this process ran
        assert took < 1.0 + 0.6
    assert report.undelivered == {"dropped_shutdown": 50}


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failures_keep_events_and_name_the_url_not_the_key(sink, status, caplog):
    sink.behaviour.api_key = "the-right-key"
    key = "the-right-key" if status == 401 else "a-wrong-key"
    # 401: no key at all; 403: a wrong one.
    transport = HttpTransport(sink.url, mode="single", api_key=None if status == 401 else key)
    with caplog.at_level(logging.ERROR, logger="outbox"):
        outbox = Outbox(transport, **FAST)
        outbox.emit(run_event())
        assert wait_until(lambda: outbox.stats().retried >= 2, 5)
    stats = outbox.stats()
    assert stats.in_flight == 1
    assert stats.delivered == 0
    assert f"{sink.url}/api/v1/lineage answered {status}" in caplog.text
    assert "check the API key" in caplog.text
    for text in (caplog.text, stats.last_error or "", repr(transport), repr(outbox)):
        assert "a-wrong-key" not in text
    sink.behaviour.api_key = None
    assert outbox.flush(5)
    assert outbox.close(1).complete


def test_404_on_the_single_endpoint_is_a_misconfiguration(sink, caplog):
    with caplog.at_level(logging.ERROR, logger="outbox"):
        outbox = outbox_for(sink.url, mode="single", endpoint="api/v1/lineages")
        outbox.emit(run_event())
        assert wait_until(lambda: outbox.stats().retried >= 2, 5)
    assert outbox.stats().dropped == {}
    assert "/api/v1/lineages answered 404" in caplog.text
    assert "OPENLINEAGE_ENDPOINT" in caplog.text
    outbox.close(0.1)


@pytest.mark.parametrize("missing_status", [404, 405])
def test_auto_falls_back_to_single_for_good(sink, missing_status, caplog):
    sink.behaviour.single_only = True
    sink.behaviour.batch_missing_status = missing_status
    with caplog.at_level(logging.WARNING, logger="outbox"):
        outbox = outbox_for(sink.url, mode="auto", linger=0.05)
        for i in range(30):
            outbox.emit(run_event(n=i))
        assert outbox.flush(5)
        for i in range(30, 40):
            outbox.emit(run_event(n=i))
        report = outbox.close(5)
    assert report.delivered == 40
    assert sorted(e["n"] for e in sink.events) == list(range(40))
    batch_attempts = [s for p, s, _ in sink.requests if p.endswith("/batch")]
    assert batch_attempts == [missing_status]  # tried once, never again
    assert caplog.text.count("no batch endpoint there") == 1


def test_marquez_flavor_auto_mode(sink):
    sink.behaviour.flavor = "marquez"
    outbox = outbox_for(sink.url)
    for i in range(10):
        outbox.emit(run_event(n=i))
    assert outbox.close(5).delivered == 10
    assert [s for p, s, _ in sink.requests if not p.endswith("/batch")] == [201] * 10


def test_single_mode_runs_concurrently_but_keeps_each_runs_order(sink):
    sink.behaviour.delay = 0.1  # one at a time, 60 requests would take 6 s
    runs = [str(uuid.uuid4()) for _ in range(20)]
    outbox = outbox_for(sink.url, mode="single", max_concurrent_requests=10, linger=0.05)
    for state in ("START", "RUNNING", "COMPLETE"):
        for run in runs:
            outbox.emit(run_event(run_id=run, state=state))
    assert outbox.close(30).delivered == 60
    assert sink.most_concurrent >= 2  # several requests at once (each run's in order, below)
    for run in runs:
        states = [e["eventType"] for e in sink.events if e["run"]["runId"] == run]
        assert states == ["START", "RUNNING", "COMPLETE"]


def test_single_mode_keeps_a_runs_later_events_behind_a_retry(sink):
    # The first request fails (503); its run's later events must not overtake it.
    sink.behaviour.fail_status = 503
    sink.behaviour.fail_rate = 1.0
    run = str(uuid.uuid4())
    outbox = outbox_for(sink.url, mode="single", linger=0.1)
    for state in ("START", "RUNNING", "COMPLETE"):
        outbox.emit(run_event(run_id=run, state=state))
    assert wait_until(lambda: len(sink.requests) >= 1, 5)
    sink.behaviour.fail_status = None
    assert outbox.close(5).delivered == 3
    assert [e["eventType"] for e in sink.events] == ["START", "RUNNING", "COMPLETE"]


def test_gzip_and_custom_headers(sink):
    outbox = outbox_for(sink.url, compression="gzip", custom_headers={"X-Tenant": "t1"}, api_key="k")
    outbox.emit(run_event(n=5))
    assert outbox.close(5).delivered == 1
    assert sink.events[0]["n"] == 5
    headers = {k.lower(): v for k, v in sink.last_headers.items()}
    assert headers["content-encoding"] == "gzip"
    assert headers["x-tenant"] == "t1"
    assert headers["authorization"] == "Bearer k"


def test_openmetadata_flavor(sink):
    sink.behaviour.flavor = "openmetadata"
    sink.behaviour.api_key = "jwt-token"
    transport = HttpTransport(
        sink.url,
        endpoint="api/v1/openlineage/lineage",
        batch_endpoint="api/v1/openlineage/lineage/batch",
        batch_format="openmetadata",
        api_key="jwt-token",
    )
    outbox = Outbox(transport, **FAST)
    bad = run_event(n=1)
    bad["job"]["namespace"] = ""
    for event in (run_event(n=0), bad, run_event(n=2)):
        outbox.emit(event)
    report = outbox.close(5)
    assert report.delivered == 2
    assert report.undelivered == {"rejected_by_backend": 1}
    assert {p for p, _, _ in sink.requests} == {"/api/v1/openlineage/lineage/batch"}


def test_every_event_sent_conforms_to_the_openlineage_schema(sink):
    from openlineage.client.event_v2 import InputDataset, Job, Run, RunEvent, RunState
    from openlineage.client.facet_v2 import error_message_run, job_type_job

    job = Job(
        namespace="vast-dataengine://my-tenant",
        name="lineage-demo.lineagefn",
        facets={
            "jobType": job_type_job.JobTypeJobFacet(
                processingType="STREAMING", integration="VAST_DATAENGINE", jobType="FUNCTION"
            )
        },
    )
    outbox = outbox_for(sink.url)
    run_id = str(uuid.uuid4())
    for state, facets in (
        (RunState.START, {}),
        (
            RunState.FAIL,
            {
                "errorMessage": error_message_run.ErrorMessageRunFacet(
                    message="boom", programmingLanguage="python"
                )
            },
        ),
    ):
        outbox.emit(
            RunEvent(
                eventType=state,
                eventTime="2026-12-02T10:00:00.000000+00:00",
                run=Run(runId=run_id, facets=facets),
                job=job,
                producer="https://example.com/tests",
                inputs=[InputDataset(namespace="s3://docs-src", name="lineage-src/orders.bad")],
            )
        )
    assert outbox.close(5).delivered == 2
    assert len(sink.events) == 2
    for event in sink.events:
        spec.validate(event)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("3", 3.0),
        ("0.5", 0.5),
        ("-4", 0.0),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 10.0),
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),
    ],
)
def test_parse_retry_after(value, expected):
    now = 1445412470.0  # 2015-10-21 07:27:50 UTC
    assert parse_retry_after(value, now=now) == expected


def test_redact_url():
    assert redact_url("http://user:secret@host:5000/x") == "http://user:***@host:5000/x"
    assert redact_url("http://host/x") == "http://host/x"


def test_close_keeps_what_was_acknowledged_when_single_mode_runs_out_of_time(sink):
    # 0.3 s per request, one at a time, 3 s to close: about 10 acknowledged, the rest not (with
    # 4 requests in each of 8 lanes and 1 s to close, none was acknowledged beside other work).
    sink.behaviour.delay = 0.3
    outbox = outbox_for(sink.url, mode="single", max_concurrent_requests=1, max_concurrency=1, linger=10)
    for i in range(100):
        outbox.emit(run_event(n=i))
    report = outbox.close(3.0)
    arrived = len(sink.events)
    assert report.delivered > 0
    assert report.undelivered.get("dropped_shutdown", 0) > 0
    # Nothing is counted delivered that did not arrive.  What arrived unacknowledged: the
    # request cut off at the deadline (one at a time) and, when the machine lags the loop past
    # the transport's margin so that the worker cancels its send at the deadline, what that
    # call had acknowledged (at least once, as documented): one slice's requests, 4 here (10
    # arrived for 8 delivered beside two CI runs and two busy processes on 2 cores).
    per_call = math.ceil(_SINGLE_SLICE / sink.behaviour.delay) + 1
    assert report.delivered <= arrived <= report.delivered + per_call
    assert report.delivered + report.undelivered.get("dropped_shutdown", 0) == 100


def test_close_during_a_long_single_mode_batch_counts_what_was_acknowledged(sink):
    # The batch is on its way (with a far deadline) when close(1.5) begins: the transport's
    # one-second slices hand the rest back, and the next call carries close's own deadline.
    sink.behaviour.delay = 0.3
    outbox = outbox_for(sink.url, mode="single", max_concurrent_requests=4, linger=0)
    # More than 8 lanes x 4 requests can carry in 1.5 s at 0.3 s each (at most 160).
    for i in range(1000):
        outbox.emit(run_event(n=i))
    assert wait_until(lambda: len(sink.requests) >= 1, 5)
    report = outbox.close(1.5)
    arrived = len(sink.events)
    assert report.delivered >= 8
    # Requests cut off at the deadline arrived without an answer: at most 4 per lane.
    assert report.delivered <= arrived <= report.delivered + 4 * parts.settings(outbox).max_concurrency
    assert report.delivered + report.undelivered.get("dropped_shutdown", 0) == 1000
    assert report.undelivered.keys() <= {"dropped_shutdown"}
    # Deferred events are not failures; only the requests cut off at the deadline (4 a lane) are.
    assert outbox.stats().retried <= 4 * parts.settings(outbox).max_concurrency


def test_a_request_does_not_search_sys_path_for_sniffio(sink, monkeypatch):
    """httpcore imports sniffio each time it makes a lock (a few times per request); where
    sniffio is not installed, each such import searched sys.path again (about 60 µs of the
    sidecar's CPU).  Delivering events now looks nothing up on sys.path."""
    import importlib.machinery

    searched: list[str] = []
    find_spec = importlib.machinery.PathFinder.find_spec

    def counting(name, path=None, target=None):  # type: ignore[no-untyped-def]
        searched.append(name)
        return find_spec(name, path, target)

    outbox = Outbox(HttpTransport(sink.url, mode="batch"), linger=0.0, close_at_exit=False)
    outbox.emit(run_event(n=0))
    assert outbox.flush(10)  # the client made, its first request answered
    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", counting)
    for i in range(1, 4):
        outbox.emit(run_event(n=i))
        assert outbox.flush(10)
    assert outbox.close(5).delivered == 4
    assert "sniffio" not in searched, searched
