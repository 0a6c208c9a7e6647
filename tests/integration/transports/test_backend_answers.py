"""What the outbox does with backend answers it cannot simply take at their word (real HTTP
servers on loopback)."""

import logging

import pytest

from outbox import ConfigError, Outbox
from outbox.tools.sink import Sink, SinkBehaviour
from outbox.transports import HttpTransport

from support import parts
from support.chaos import running_time
from support.helpers import run_event, run_script, wait_until


@pytest.mark.parametrize("asked", ["86400", "inf", "1e400"])
def test_a_retry_after_beyond_max_retry_after_is_capped_and_logged(asked, caplog):
    with Sink(behaviour=SinkBehaviour(fail_status=429, retry_after=asked)) as sink:
        outbox = Outbox(
            HttpTransport(sink.url, mode="batch"), linger=0, max_retry_after=0.3, close_at_exit=False
        )
        with caplog.at_level(logging.WARNING, logger="outbox"):
            outbox.emit(run_event(n=0))
            assert wait_until(lambda: outbox.stats().retried >= 1, 5)
            sink.behaviour = SinkBehaviour()  # healthy again
            flushed, took = running_time(lambda: outbox.flush(5))  # (the time this process ran)
            assert flushed
            assert took < 2.0  # not a day, not for ever
        assert [e["n"] for e in sink.events] == [0]
        assert any("waiting max_retry_after (0.3 s) instead" in r.getMessage() for r in caplog.records)
        outbox.close(1)


def test_max_retry_after_is_validated_and_read_from_the_environment():
    with pytest.raises(ConfigError, match="max_retry_after=-1"):
        Outbox(HttpTransport("http://127.0.0.1:9"), max_retry_after=-1)
    outbox = Outbox.from_env({"OUTBOX_MAX_RETRY_AFTER": "12.5"}, close_at_exit=False)
    assert parts.settings(outbox).max_retry_after == 12.5
    outbox.close(0)


@pytest.mark.parametrize("status", [301, 302, 307, 308, 407])
@pytest.mark.parametrize("mode", ["single", "batch"])
def test_redirects_and_proxy_authentication_keep_the_events_and_name_the_fix(status, mode, caplog):
    behaviour = SinkBehaviour(fail_status=status, location="https://lineage.example.com/api/v1/lineage")
    with Sink(behaviour=behaviour) as sink:
        outbox = Outbox(HttpTransport(sink.url, mode=mode), linger=0, backoff_base=0.01, close_at_exit=False)
        with caplog.at_level(logging.ERROR, logger="outbox"):
            for i in range(3):
                outbox.emit(run_event(n=i))
            assert wait_until(lambda: outbox.stats().retried >= 3, 5)
            stats = outbox.stats()
            assert stats.lost == 0  # kept, not rejected
            sink.behaviour = SinkBehaviour()
            assert outbox.flush(5)
        assert sorted(e["n"] for e in sink.events) == [0, 1, 2]
        errors = " ".join(r.getMessage() for r in caplog.records)
        assert f"answered {status}" in errors
        if status == 407:
            assert "HTTPS_PROXY" in errors
        else:
            assert "redirects to https://lineage.example.com/api/v1/lineage" in errors
        outbox.close(1)


# -- secrets ------------------------------------------------------------------------------


class EchoingBackend:
    """Answers 400 quoting the request's Authorization header back (some do)."""

    def __init__(self) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = f'{{"error": "bad request with Authorization: {self.headers.get("Authorization")}"}}'
                self.send_response(400)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_api_key_ending_in_a_newline_is_stripped_and_works():
    with Sink(behaviour=SinkBehaviour(api_key="s3cret-key")) as sink:
        outbox = Outbox(HttpTransport(sink.url, api_key="s3cret-key\n"), linger=0, close_at_exit=False)
        outbox.emit(run_event())
        assert outbox.close(5).delivered == 1
        assert sink.last_headers["Authorization"] == "Bearer s3cret-key"


@pytest.mark.parametrize("key", ["abc\ndef", "abc\x00def", "abc\rdef"])
def test_an_api_key_with_a_control_character_is_a_config_error_that_does_not_show_it(key):
    with pytest.raises(ConfigError, match="control character") as caught:
        HttpTransport("http://127.0.0.1:9", api_key=key)
    assert "abc" not in str(caught.value)


@pytest.mark.parametrize("mode", ["single", "batch"])
def test_a_credential_echoed_by_the_backend_is_redacted_everywhere(mode, caplog):
    backend = EchoingBackend()
    try:
        url = backend.url.replace("http://", "http://alice:pa%24%24word@")
        for transport in (
            HttpTransport(backend.url, api_key="s3cret-key", mode=mode),
            HttpTransport(url, mode=mode),
        ):
            outbox = Outbox(transport, linger=0, close_at_exit=False)
            with caplog.at_level(logging.DEBUG):
                outbox.emit(run_event())
                report = outbox.close(5)
            assert report.undelivered == {"rejected_by_backend": 1}
            seen = (outbox.stats().last_error or "") + repr(outbox) + caplog.text
            assert "Authorization" in (outbox.stats().last_error or "")  # the echo itself is kept
            for secret in ("s3cret-key", "pa$$word", "pa%24%24word", "YWxpY2U6cGEkJHdvcmQ="):
                assert secret not in seen
            caplog.clear()
    finally:
        backend.close()


def test_user_info_in_the_url_becomes_basic_auth_and_never_reaches_httpx_logs(caplog):
    """Through the transport's own client (a plain http:// URL, which logs no request)."""
    with Sink() as sink:
        url = sink.url.replace("http://", "http://alice:pa%24%24word@")
        transport = HttpTransport(url)
        assert "pa$$word" not in repr(transport)
        assert "pa%24%24word" not in repr(transport)
        outbox = Outbox(transport, linger=0, close_at_exit=False)
        with caplog.at_level(logging.DEBUG):
            outbox.emit(run_event())
            assert outbox.close(5).delivered == 1
        assert sink.last_headers["Authorization"] == "Basic YWxpY2U6cGEkJHdvcmQ="  # alice:pa$$word
        assert "word" not in caplog.text


@pytest.mark.parametrize(
    "url", ["http://marquez:http/", "http://marquez:99999", "http://user:pw@marquez:x5000"]
)
def test_a_url_with_a_bad_port_is_a_config_error_at_construction(url):
    with pytest.raises(ConfigError, match="port that is not a number") as caught:
        HttpTransport(url)
    assert "pw" not in str(caught.value)


# -- what the sidecar refuses to send ------------------------------------------------------


def test_an_event_holding_a_value_json_cannot_hold_is_dropped_as_invalid_not_sent_as_a_placeholder():
    from outbox.transports import MemoryTransport

    transport = MemoryTransport()
    outbox = Outbox(transport, linger=0, close_at_exit=False)
    bad = run_event(n=1)
    bad["run"]["facets"] = {"custom": {"_producer": "p", "_schemaURL": "s", "value": object()}}
    for event in (run_event(n=0), bad, run_event(n=2)):
        assert outbox.emit(event)
    report = outbox.close(5)
    assert report.undelivered == {"invalid_event": 1}
    assert [e["n"] for e in transport.events] == [0, 2]
    assert "non-serializable" not in str(transport.events)


def test_a_pre_serialized_event_too_large_for_a_batch_is_dropped_before_it_is_parsed():
    from outbox.transports import MemoryTransport

    transport = MemoryTransport()
    outbox = Outbox(transport, linger=0, max_batch_bytes=1024 * 1024, close_at_exit=False)
    # Not even JSON: had it been parsed first, it would count as invalid_event.
    assert outbox.emit("{" + "x" * (2 * 1024 * 1024))
    assert outbox.emit(b"[" * (3 * 1024 * 1024))
    report = outbox.close(5)
    assert report.undelivered == {"too_large": 2}


# -- answers are read within a bound -------------------------------------------------------


@pytest.mark.parametrize("status", [200, 500])
def test_a_huge_answer_is_read_only_up_to_the_bound(status):
    code = f"""
    import resource, socket, threading
    from outbox import Outbox
    from outbox.transports import HttpTransport

    size = 400 * 1024 * 1024  # what the backend answers
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def read_request(conn):
        data = b""
        while b"\\r\\n\\r\\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\\r\\n\\r\\n")
        lines = [l for l in head.split(b"\\r\\n") if l.lower().startswith(b"content-length")]
        length = int(lines[0].split(b":")[1])
        while len(body) < length:
            body += conn.recv(65536)

    def serve():
        conn, _ = server.accept()
        read_request(conn)
        conn.sendall(b"HTTP/1.1 {status} X\\r\\nContent-Length: %d\\r\\n\\r\\n" % size)
        chunk = b"[" * (1024 * 1024)
        try:
            for _ in range(size // len(chunk)):
                conn.sendall(chunk)
        except OSError:
            pass  # the client stopped reading and closed: what we want
        conn.close()
        # The retry of a 500 (on a connection of its own): taken, so that close ends at once
        # rather than at its deadline.
        while True:
            conn, _ = server.accept()
            read_request(conn)
            conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 0\\r\\n\\r\\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    url = "http://127.0.0.1:%d" % server.getsockname()[1]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outbox = Outbox(HttpTransport(url, mode="batch", timeout=30), linger=0, close_at_exit=False)
    outbox.emit({{"eventType": "START", "run": {{"runId": "r"}}, "job": {{"namespace": "n", "name": "j"}}}})
    report = outbox.close(20)  # ends once the answer is read (1.5 s was not enough beside other work)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(grown, report.delivered, report.undelivered)
    """
    result, _ = run_script(code, timeout=120)
    assert result.returncode == 0, result.stderr
    grown, delivered = result.stdout.split()[:2]
    assert float(grown) < 64, f"the process grew by {grown} MiB reading a 400 MiB answer"
    # A 2xx whose body is cut is still a 2xx; a 500 is retried, and taken.
    assert delivered == "1"


# -- batch shape, batch size and order through splits -----------------------------------


@pytest.mark.parametrize("mode", ["batch", "auto"])
def test_a_wrong_batch_format_keeps_the_events_and_names_the_setting(mode, caplog):
    om = {
        "endpoint": "api/v1/openlineage/lineage",
        "batch_endpoint": "api/v1/openlineage/lineage/batch",
        "batch_format": "array",  # wrong: OpenMetadata's batch route takes {"events": [...]}
    }
    with Sink(behaviour=SinkBehaviour(flavor="openmetadata")) as sink:
        outbox = Outbox(HttpTransport(sink.url, mode=mode, **om), linger=0.05, close_at_exit=False)
        with caplog.at_level(logging.WARNING, logger="outbox"):
            for i in range(6):
                outbox.emit(run_event(n=i))
            if mode == "auto":
                assert outbox.flush(10)  # it found out, and went on one event per request
                assert sorted(e["n"] for e in sink.events) == list(range(6))
            else:
                assert wait_until(lambda: outbox.stats().retried >= 5, 10)
                stats = outbox.stats()
                assert "rejected_by_backend" not in stats.dropped  # kept, not dropped one by one
                assert "batch_format" in (stats.last_error or "")
        assert "check batch_format (now 'array'" in caplog.text
        outbox.close(0.5)


def test_a_wrong_batch_format_is_found_with_a_batch_of_one_event(caplog):
    # A linger that ends with one event sends a batch of one (seen in CI beside load: the
    # first events were rejected for good, as bad events, before a larger batch showed that
    # the batch's shape was wrong).
    om = {
        "endpoint": "api/v1/openlineage/lineage",
        "batch_endpoint": "api/v1/openlineage/lineage/batch",
        "batch_format": "array",
    }
    with Sink(behaviour=SinkBehaviour(flavor="openmetadata")) as sink:
        outbox = Outbox(HttpTransport(sink.url, mode="batch", **om), linger=0, close_at_exit=False)
        with caplog.at_level(logging.WARNING, logger="outbox"):
            outbox.emit(run_event(n=0))
            assert outbox.flush(10)
        stats = outbox.stats()
        outbox.close(0.5)
    assert "rejected_by_backend" not in stats.dropped, stats
    assert [e["n"] for e in sink.events] == [0]  # through the single endpoint, which takes it
    assert "check batch_format (now 'array'" in caplog.text


@pytest.mark.parametrize("events", [1, 4])
def test_a_batch_of_events_that_are_all_bad_is_still_rejected(events):
    with Sink() as sink:
        outbox = Outbox(HttpTransport(sink.url, mode="batch"), linger=0.05, close_at_exit=False)
        for i in range(events):
            bad = run_event(n=i)
            bad["run"]["runId"] = "not-a-uuid"
            outbox.emit(bad)
        report = outbox.close(5)
    assert report.undelivered == {"rejected_by_backend": events}


def test_every_request_stays_within_max_batch_bytes_for_dict_events():
    limit = 1024 * 1024
    with Sink(behaviour=SinkBehaviour(max_body=limit)) as sink:  # 413 to anything larger
        outbox = Outbox(
            HttpTransport(sink.url, mode="batch"), max_batch_bytes=limit, linger=0.5, close_at_exit=False
        )
        for i in range(300):
            event = run_event(n=i)
            event["run"]["facets"] = {"big": {"_producer": "p", "_schemaURL": "s", "x": "x" * 100_000}}
            outbox.emit(event)
        report = outbox.close(20)
        statuses = {status for _, status, _ in sink.requests}
    assert report.delivered == 300
    assert statuses == {200}  # no request was larger than max_batch_bytes
    assert len(sink.requests) >= 300 * 100_000 // limit


def test_order_per_run_holds_through_413_splits_under_a_flaky_backend():
    run = "33333333-3333-3333-3333-333333333333"
    with Sink(behaviour=SinkBehaviour(max_body=40_000, fail_status=503, fail_rate=0.3)) as sink:
        outbox = Outbox(
            HttpTransport(sink.url, mode="batch"),
            max_batch_bytes=200_000,
            linger=0.05,
            backoff_base=0.01,
            backoff_cap=0.05,
            close_at_exit=False,
        )
        for i in range(400):
            event = run_event(run_id=run, n=i)
            event["run"]["facets"] = {"pad": {"_producer": "p", "_schemaURL": "s", "x": "y" * 2000}}
            outbox.emit(event)
        assert outbox.flush(60), outbox.stats()
        sink.behaviour = SinkBehaviour()
        outbox.close(5)
        arrived = [e["n"] for e in sink.events]
    assert any(status == 413 for _, status, _ in sink.requests)  # it did split
    firsts = list(dict.fromkeys(arrived))
    assert firsts == sorted(firsts) == list(range(400))


def test_a_credential_in_a_custom_header_echoed_by_the_backend_is_redacted(caplog):
    backend = EchoingBackend()
    try:
        headers = {"Authorization": "Token abcd-s3cret-value"}
        outbox = Outbox(HttpTransport(backend.url, custom_headers=headers), linger=0, close_at_exit=False)
        with caplog.at_level(logging.DEBUG):
            outbox.emit(run_event())
            report = outbox.close(5)
        assert report.undelivered == {"rejected_by_backend": 1}
        seen = (outbox.stats().last_error or "") + caplog.text
        assert "Authorization: ***" in seen  # the echo is kept, its credential is not (longest first)
        assert "s3cret" not in seen
    finally:
        backend.close()


def test_a_header_that_slipped_past_the_checks_is_never_quoted_in_a_log(caplog):
    """White box, the last line of defence: a header value changed after construction (the
    constructor refuses such values) makes h11 raise an error that quotes it; the transport
    returns a retry naming the problem, never the text, and the worker logs no exception."""
    with Sink() as sink:
        transport = HttpTransport(sink.url, mode="single")
        parts.http_headers(transport)["X-Api-Key"] = "abc\r\nd-s3cret"
        outbox = Outbox(transport, linger=0, backoff_base=0.01, backoff_cap=0.05, close_at_exit=False)
        with caplog.at_level(logging.DEBUG):
            outbox.emit(run_event())
            assert wait_until(lambda: outbox.stats().retried >= 1, 5)
            last_error = outbox.stats().last_error or ""
            report = outbox.close(0.3)
        assert sink.events == []
    assert report.undelivered == {"dropped_shutdown": 1}
    assert "could not be sent: LocalProtocolError" in last_error
    # The outbox's own log (httpcore's DEBUG trace quotes its exceptions, as it does for anyone).
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name == "outbox")
    assert "could not be sent: LocalProtocolError" in ours
    assert "raised" not in ours
    assert "s3cret" not in ours + last_error


# -- DataHub's URNs ------------------------------------------------------------------------


def datahub_event(key, table=None, n=0):
    from outbox import DatasetRef, s3_dataset

    dataset = s3_dataset(
        "docs-src", key, table=None if table is None else DatasetRef("trino://t:8080", table)
    )
    event = run_event(n=n)
    event["run"]["facets"]["processing_engine"] = {
        "_producer": "p",
        "_schemaURL": "s",
        "name": "VAST_DATAENGINE",
    }
    event["inputs"] = [
        {"namespace": dataset.namespace, "name": dataset.name, "facets": dict(dataset.facets or {})}
    ]
    return event


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("lineage-src/orders(1).csv", "'(' ')', which DataHub's dataset URNs cannot hold"),
        ("lineage-src/a,b.csv", "',', which DataHub's dataset URNs cannot hold"),
        ("lineage-src/my orders.csv", "so DataHub cannot make a URI of it and leaves the dataset out"),
        ("lineage-src/100%.csv", "so DataHub cannot make a URI of it"),
    ],
)
def test_a_dataset_name_datahubs_urns_cannot_hold_is_reported_once_with_the_fix(key, said, caplog):
    with Sink(behaviour=SinkBehaviour(flavor="datahub")) as sink:
        transport = HttpTransport(f"{sink.url}/openapi/openlineage/", mode="single")
        outbox = Outbox(transport, linger=0, close_at_exit=False)
        with caplog.at_level(logging.WARNING, logger="outbox"):
            for i in range(3):
                outbox.emit(datahub_event(key, n=i))
            report = outbox.close(5)
    assert report.delivered == 3  # DataHub takes them: the loss is inside DataHub
    warnings = [r.getMessage() for r in caplog.records if "DataHub" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"the dataset s3://docs-src/{key} holds " in warnings[0]
    assert said in warnings[0]
    assert "name the table it belongs to (s3_dataset(..., table=...)" in warnings[0]


def test_names_datahub_can_hold_or_a_table_symlink_are_not_reported(caplog):
    with Sink(behaviour=SinkBehaviour(flavor="datahub")) as sink, Sink() as other:
        datahub = Outbox(
            HttpTransport(f"{sink.url}/openapi/openlineage/", mode="single"), linger=0, close_at_exit=False
        )
        marquez = Outbox(HttpTransport(other.url), linger=0, close_at_exit=False)
        with caplog.at_level(logging.WARNING, logger="outbox"):
            datahub.emit(datahub_event("lineage-src/orders.csv"))
            datahub.emit(datahub_event("lineage-src/orders(1).csv", table="vast.lineage.orders_raw"))
            marquez.emit(datahub_event("lineage-src/orders(1).csv"))  # not DataHub: not its rules
            assert datahub.close(5).delivered == 2
            assert marquez.close(5).delivered == 1
    assert "DataHub" not in caplog.text


@pytest.mark.parametrize(
    ("status", "retry_after", "retried"), [(502, None, True), (500, None, False), (503, "0", True)]
)
def test_a_custom_status_forcelist_is_what_is_retried(status, retry_after, retried):
    """openlineage-python's retry.status_forcelist, honoured as urllib3 reads it: the listed
    statuses (and 413, 429 or 503 with a Retry-After) are retried; another 5xx is final."""
    env = {
        "OPENLINEAGE__TRANSPORT__TYPE": "http",
        "OPENLINEAGE__TRANSPORT__MODE": "single",
        "OPENLINEAGE__TRANSPORT__RETRY": '{"total": 3, "status_forcelist": [502]}',
    }
    with Sink(behaviour=SinkBehaviour(fail_status=status, retry_after=retry_after)) as sink:
        env["OPENLINEAGE__TRANSPORT__URL"] = sink.url
        outbox = Outbox.from_env(env, linger=0, backoff_base=0.01, backoff_cap=0.05, close_at_exit=False)
        outbox.emit(run_event())
        if retried:
            assert wait_until(lambda: outbox.stats().retried >= 2, 10)
            sink.behaviour = SinkBehaviour()
            assert outbox.close(5).delivered == 1
        else:
            report = outbox.close(5)
            assert report.undelivered == {"rejected_by_backend": 1}
            assert outbox.stats().retried == 0
