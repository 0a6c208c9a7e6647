"""outbox sink: validation, storage, listing, the command line."""

import contextlib
import json
import re
import signal
import subprocess
import sys
import time

import httpx
import orjson
import pytest

from outbox.tools.sink import Sink, validate_event

from support.helpers import run_event


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (lambda e: None, None),
        (lambda e: e.pop("eventTime"), "eventTime must not be null"),
        (lambda e: e.update(eventTime="2026-12-02"), "must be an ISO-8601 date-time"),
        (lambda e: e.update(eventTime="2026-12-02T10:00:00"), "must carry a UTC offset"),
        (lambda e: e.update(eventTime="2026-12-02T10:00:00Z"), None),
        (lambda e: e["run"].update(runId=None), "run.runId must not be null"),
        (lambda e: e["run"].update(runId="42"), "run.runId '42' must be a UUID"),
        (lambda e: e["job"].pop("name"), "job.name must not be null"),
        (lambda e: e.update(eventType="DONE"), "eventType 'DONE' must be one of"),
        (lambda e: e.pop("producer"), "producer must not be null"),
        (lambda e: e.update(inputs=[{"namespace": "s3://b"}]), "inputs[0].name must not be null"),
    ],
)
def test_validate_run_events(mutate, error):
    event = run_event()
    mutate(event)
    errors = validate_event(event)
    if error is None:
        assert errors == []
    else:
        assert any(error in e for e in errors), errors


def test_validate_other_kinds():
    base = {"eventTime": "2026-12-02T10:00:00Z", "producer": "p", "schemaURL": "s"}
    assert validate_event({**base, "job": {"namespace": "n", "name": "j"}}) == []
    assert validate_event({**base, "dataset": {"namespace": "n", "name": "d"}}) == []
    assert validate_event({**base, "dataset": {"namespace": "n"}}) == ["dataset.name must not be null"]
    assert "not a RunEvent, DatasetEvent or JobEvent" in validate_event(base)[0]
    assert validate_event([]) == ["an event must be a JSON object, not list"]


def test_endpoints_store_list_and_clear(tmp_path):
    store = tmp_path / "events.jsonl"
    with Sink(store=str(store)) as sink, httpx.Client(base_url=sink.url) as client:
        assert client.get("/healthz").text == "ok"
        assert client.post("/api/v1/lineage", json=run_event(n=1)).status_code == 200
        bad = client.post("/api/v1/lineage", json={"eventType": "START"})
        assert bad.status_code == 422
        assert bad.json()["code"] == 422
        assert "eventTime must not be null" in bad.json()["errors"]
        assert client.post("/api/v1/lineage", content=b"{nope").status_code == 400
        answer = client.post("/api/v1/lineage/batch", json=[run_event(n=2), {"x": 1}, run_event(n=3)])
        assert answer.status_code == 200
        body = answer.json()
        assert body["status"] == "partial_success"
        assert body["summary"] == {
            "received": 3,
            "successful": 2,
            "failed": 1,
            "retriable": 0,
            "non_retriable": 1,
        }
        assert body["failed_events"][0]["index"] == 1
        assert body["failed_events"][0]["retriable"] is False
        assert client.post("/api/v1/lineage/batch", json={"events": []}).status_code == 400
        assert [e["n"] for e in client.get("/api/v1/events").json()] == [1, 2, 3]
        assert [e["n"] for e in client.get("/api/v1/events?limit=1").json()] == [3]
        assert client.delete("/api/v1/events").status_code == 204
        assert client.get("/api/v1/events").json() == []
    assert [json.loads(line)["n"] for line in store.read_text().splitlines()] == [1, 2, 3]


def test_the_sink_command_prints_a_line_per_event(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "outbox.tools.cli", "sink", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        banner = process.stdout.readline()
        url = re.search(r"on (http://\S+):", banner).group(1)
        event = run_event(run_id="00005015-0000-0016-2e04-8a6dbdde4eb9", job="lineage-demo.lineagefn")
        assert httpx.post(f"{url}/api/v1/lineage", json=event).status_code == 200
        line = process.stdout.readline()
        assert "START" in line
        assert "tests/lineage-demo.lineagefn" in line
        assert "run=00005015-0000-0016-2e04-8a6dbdde4eb9" in line
    finally:
        process.terminate()
        process.wait(5)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_sink_command_prints_its_summary_when_stopped(stop):
    """#39: SIGTERM (how a service manager or a container stops it) ended the sink without its
    summary, which only Ctrl-C printed."""
    process, _, url = start_sink_command("--quiet")
    try:
        assert httpx.post(f"{url}/api/v1/lineage", json=run_event()).status_code == 200
        process.send_signal(stop)
        out, _ = process.communicate(timeout=10)
    finally:
        process.kill()
    assert process.returncode == 0, (process.returncode, out)
    assert out.splitlines()[-1] == "received 1 events"


def test_slow_switch_delays_answers():
    with Sink() as sink:
        sink.behaviour.delay = 0.2
        started = time.monotonic()
        httpx.post(f"{sink.url}/api/v1/lineage", json=run_event())
        assert time.monotonic() - started >= 0.2


def test_accept_most_refuses_every_request_once_that_many_events_are_accepted():
    with Sink() as sink:
        sink.behaviour.accept_most = 3
        batch = httpx.post(f"{sink.url}/api/v1/lineage/batch", json=[run_event(n=i) for i in range(2)])
        single = httpx.post(f"{sink.url}/api/v1/lineage", json=run_event(n=2))
        late = [httpx.post(f"{sink.url}/api/v1/lineage", json=run_event(n=3)) for _ in range(2)]
        assert [batch.status_code, single.status_code] == [200, 200]
        assert [answer.status_code for answer in late] == [503, 503]
        assert [event["n"] for event in sink.events] == [0, 1, 2]
        sink.behaviour.accept_most = None
        assert httpx.post(f"{sink.url}/api/v1/lineage", json=run_event(n=4)).status_code == 200


def test_fast_and_full_validation_agree():
    base = {"eventTime": "2026-12-02T10:00:00Z", "producer": "p", "schemaURL": "s"}
    cases = [
        {**base, "job": {"namespace": "n", "name": ""}},
        {**base, "job": {"namespace": "n", "name": "j"}, "inputs": [{"namespace": "", "name": "x"}]},
        {**base, "run": {"runId": "00005015-0000-0016-2e04-8a6dbdde4eb9"}, "job": {"namespace": "n"}},
        {
            **base,
            "run": {"runId": "0000501500000016" + "2e048a6dbdde4eb9"},
            "job": {"namespace": "n", "name": "j"},
        },
    ]
    from outbox.tools._sink_rules import _plainly_valid

    for event in cases:
        full = validate_event(event)
        assert _plainly_valid(event) is False or full == []
    assert validate_event(cases[0]) == ["job.name must not be null"]
    assert validate_event(cases[3]) == []  # uuid.UUID accepts the unhyphenated form; so do we


# -- the released backends' answers ---------------------------------------------------------


def test_the_datahub_flavour_has_one_route_and_needs_an_orchestrator():
    from outbox.tools.sink import SinkBehaviour

    plain = run_event()  # producer https://example.com/tests, no processing_engine facet
    engine = run_event()
    engine["run"]["facets"]["processing_engine"] = {
        "_producer": "p",
        "_schemaURL": "https://openlineage.io/spec/facets/1-1-1/ProcessingEngineRunFacet.json",
        "version": "5.3",
        "name": "VAST_DATAENGINE",
    }
    openlineage = {
        **run_event(),
        "producer": "https://github.com/OpenLineage/OpenLineage/tree/1.54.0/client/python",
    }
    with Sink(behaviour=SinkBehaviour(flavor="datahub")) as sink:
        single = f"{sink.url}/openapi/openlineage/api/v1/lineage"
        assert httpx.post(f"{single}/batch", json=[engine]).status_code == 404
        refused = httpx.post(single, json=plain)
        assert refused.status_code == 500
        assert refused.json() == {"error": "Unable to determine orchestrator"}
        assert httpx.post(single, json=engine).status_code == 200
        assert httpx.post(single, json=openlineage).status_code == 200
        assert httpx.post(f"{sink.url}/api/v1/lineage", json=engine).status_code == 404
        assert len(sink.events) == 2


@pytest.mark.parametrize("all_failed_status", [200, 400])
def test_the_openmetadata_flavour_answers_as_released_2_0_7_or_newer(all_failed_status):
    from outbox.tools.sink import SinkBehaviour

    behaviour = SinkBehaviour(
        flavor="openmetadata",
        openmetadata_all_failed_status=all_failed_status,
        openmetadata_tables=("trino.vast.lineage.orders", "mysql.default.s.t"),
    )
    complete = {**run_event(state="COMPLETE"), "inputs": [{"namespace": "mysql://h", "name": "s.t"}]}
    complete["outputs"] = [
        {"namespace": "trino://h:8080", "name": "vast.lineage.orders"},
        {"namespace": "n", "name": "s.t"},
    ]
    bad = run_event()
    bad["job"]["name"] = ""
    with Sink(behaviour=behaviour) as sink:
        base = f"{sink.url}/api/v1/openlineage/lineage"
        answer = httpx.post(base, json=complete)
        assert answer.status_code == 200
        assert answer.json()["lineageEdgesCreated"] == 2  # 2 outputs x 1 input, all resolved
        assert httpx.post(base, json=run_event()).json()["lineageEdgesCreated"] == 0  # START, no outputs
        failed = httpx.post(f"{base}/batch", json={"events": [bad, bad]})
        assert failed.status_code == all_failed_status
        assert failed.json()["status"] == "failure"
        assert [f["index"] for f in failed.json()["failedEvents"]] == [0, 1]
        partial = httpx.post(f"{base}/batch", json={"events": [bad, complete]})
        assert partial.status_code == 200
        assert partial.json()["status"] == "partial_success"


CATALOGUE = ("trino.vast.lineage.docs-src_raw", "trino.vast.lineage.docs-src_orders")
RAW = {"namespace": "trino://vast-trino:8080", "name": "vast.lineage.docs-src_raw", "type": "TABLE"}
ORDERS = {"namespace": "trino://vast-trino:8080", "name": "vast.lineage.docs-src_orders"}


def s3_input(symlink=None):
    dataset = {"namespace": "s3://docs-src", "name": "lineage-src/orders.csv", "facets": {}}
    if symlink is not None:
        dataset["facets"]["symlinks"] = {"_producer": "p", "_schemaURL": "s", "identifiers": [symlink]}
    return dataset


@pytest.mark.parametrize(
    ("tables", "event", "edges"),
    [
        # An S3 object never resolves to a table, even with outputs the server knows.
        (CATALOGUE, {"eventType": "COMPLETE", "inputs": [s3_input()], "outputs": [ORDERS]}, 0),
        # A TABLE symlink on it names a table the server has: one edge.
        (CATALOGUE, {"eventType": "COMPLETE", "inputs": [s3_input(RAW)], "outputs": [ORDERS]}, 1),
        # ...but only a table it has: the catalogue is what the server ingested.
        ((), {"eventType": "COMPLETE", "inputs": [s3_input(RAW)], "outputs": [ORDERS]}, 0),
        (CATALOGUE[1:], {"eventType": "COMPLETE", "inputs": [s3_input(RAW)], "outputs": [ORDERS]}, 0),
        # Processed as COMPLETE when eventType is missing; START and FAIL are skipped.
        (CATALOGUE, {"inputs": [s3_input(RAW)], "outputs": [ORDERS]}, 1),
        (CATALOGUE, {"eventType": "START", "inputs": [s3_input(RAW)], "outputs": [ORDERS]}, 0),
        (CATALOGUE, {"eventType": "FAIL", "inputs": [s3_input(RAW)], "outputs": [ORDERS]}, 0),
        # No outputs, no lineage.
        (CATALOGUE, {"eventType": "COMPLETE", "inputs": [s3_input(RAW)], "outputs": []}, 0),
        # schema.table resolves by its suffix; a Glue table/db/table symlink too.
        (
            ("hive.default.sales.orders", "trino.vast.lineage.docs-src_orders"),
            {
                "eventType": "COMPLETE",
                "inputs": [
                    s3_input({"namespace": "arn:aws:glue:eu-west-1:1:x", "name": "table/sales/orders"})
                ],
                "outputs": [{"namespace": "trino://x", "name": "lineage.docs-src_orders"}],
            },
            1,
        ),
    ],
)
def test_the_openmetadata_flavour_counts_an_edge_only_where_the_server_resolves_both_ends(
    tables, event, edges
):
    """Released OpenMetadata (OpenLineageMapper, OpenLineageEntityResolver): lineage from a
    COMPLETE event (or one with no eventType), one edge per output x input, each end a table
    it already has, found by its dotted name or a symlink's."""
    from outbox.tools.sink import SinkBehaviour

    base = run_event()
    base.pop("eventType")
    body = {**base, **event}
    with Sink(behaviour=SinkBehaviour(flavor="openmetadata", openmetadata_tables=tables)) as sink:
        answer = httpx.post(f"{sink.url}/api/v1/openlineage/lineage", json=body)
    assert answer.status_code == 200
    assert answer.json()["lineageEdgesCreated"] == edges


def test_the_openmetadata_flavour_answers_400_to_a_job_or_dataset_event():
    from outbox.tools.sink import SinkBehaviour

    common = {"eventTime": "2026-12-02T10:00:00Z", "producer": "p", "schemaURL": "s"}
    job_event = {**common, "job": {"namespace": "n", "name": "j"}}
    dataset_event = {**common, "dataset": {"namespace": "n", "name": "d"}}
    with Sink(behaviour=SinkBehaviour(flavor="openmetadata")) as sink:
        base = f"{sink.url}/api/v1/openlineage/lineage"
        for event in (job_event, dataset_event):
            answer = httpx.post(base, json=event)
            assert answer.status_code == 400
            assert "is not a RunEvent" in answer.json()["message"]
        batch = httpx.post(f"{base}/batch", json={"events": [job_event, run_event()]})
        assert batch.status_code == 200
        assert [f["index"] for f in batch.json()["failedEvents"]] == [0]
        assert len(sink.events) == 1


ENGINE = {"_producer": "p", "_schemaURL": "s", "version": "5.3", "name": "VAST_DATAENGINE"}


def with_producer(producer):
    return {**run_event(), "producer": producer}


def without(key):
    event = run_event()
    event["run"]["facets"]["processing_engine"] = ENGINE
    event.pop(key)
    return event


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (with_producer("https://github.com/OpenLineage/OpenLineage/tree/1.54.0/client/python"), 200),
        # DataHub's regex needs a segment after OpenLineage/OpenLineage/: the bare client URL fails.
        (with_producer("https://github.com/OpenLineage/OpenLineage/client"), 500),
        (with_producer("https://github.com/OpenLineage/OpenLineage/"), 500),
        (with_producer("https://github.com/apache/airflow/tree/2.10/providers"), 200),
        (with_producer("https://example.com/lineage-demo"), 500),
        (without("eventType"), 500),  # the converter reads the event type: a NullPointerException
        ({**without("run"), "job": {"namespace": "n", "name": "j"}}, 500),  # a JobEvent
        (
            {"eventTime": "2026-12-02T10:00:00Z", "producer": "p", "schemaURL": "s", "dataset": {}},
            500,
        ),  # a DatasetEvent
        ([run_event()], 500),  # an array is not a RunEvent
        ({}, 500),
    ],
)
def test_the_datahub_flavour_answers_500_where_released_datahub_throws(body, status):
    from outbox.tools.sink import SinkBehaviour

    with Sink(behaviour=SinkBehaviour(flavor="datahub")) as sink:
        answer = httpx.post(f"{sink.url}/openapi/openlineage/api/v1/lineage", json=body)
        assert answer.status_code == status, answer.text
        assert len(sink.events) == (1 if status == 200 else 0)


def test_the_outbox_retries_what_datahub_answers_500_rather_than_dropping_it():
    """A 500 is retried (a 422 would be a drop): an array or {} body, as DataHub answers."""
    from outbox import Outbox
    from outbox.tools.sink import SinkBehaviour
    from outbox.transports import HttpTransport

    from support.helpers import wait_until

    with Sink(behaviour=SinkBehaviour(flavor="datahub")) as sink:
        transport = HttpTransport(f"{sink.url}/openapi/openlineage/", mode="single")
        outbox = Outbox(transport, linger=0, backoff_base=0.01, backoff_cap=0.05, close_at_exit=False)
        outbox.emit(b"{}")
        assert wait_until(lambda: outbox.stats().retried >= 2, 10)
        report = outbox.close(0.2)
    assert "rejected_by_backend" not in report.undelivered


def read_lines(process, count, timeout=15.0):
    """The next ``count`` lines of the process's stdout, or those that came within ``timeout``."""
    import queue
    import threading

    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(process.stdout.readline()) for _ in range(count)], daemon=True
    ).start()
    got = []
    with contextlib.suppress(queue.Empty):
        for _ in range(count):
            got.append(lines.get(timeout=timeout))
    assert len(got) == count, got
    return got


def start_sink_command(*options):
    # SIGINT at its default, as a terminal gives it: a suite started in the background by a
    # non-interactive shell (.ci/run's 3.12 and 3.13 suites) has it ignored, and a child
    # inherits that, so Ctrl-C's test would wait on a sink that rightly ignores it.
    process = subprocess.Popen(
        [sys.executable, "-m", "outbox.tools.cli", "sink", "--port", "0", *options],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    banner = process.stdout.readline()
    return process, banner, re.search(r"on (http://\S+):", banner).group(1)


@pytest.mark.parametrize(
    ("flavor", "routes"),
    [
        ("spec", ["/api/v1/lineage", "/api/v1/lineage/batch"]),
        ("marquez", ["/api/v1/lineage"]),
        ("datahub", ["/openapi/openlineage/api/v1/lineage"]),
        ("openmetadata", ["/api/v1/openlineage/lineage", "/api/v1/openlineage/lineage/batch"]),
    ],
)
def test_the_sink_command_lists_only_the_routes_its_flavour_has(flavor, routes):
    process, banner, _ = start_sink_command("--flavor", flavor)
    try:
        assert re.findall(r"POST (\S+?)[,\s]", banner) == routes, banner
        assert "GET /api/v1/events" in banner
    finally:
        process.terminate()
        process.wait(5)


def test_the_sink_command_logs_each_refused_request_with_its_status_and_reason():
    process, _, url = start_sink_command("--flavor", "datahub", "--api-key", "k")
    try:
        route = f"{url}/openapi/openlineage/api/v1/lineage"
        auth = {"Authorization": "Bearer k"}
        engine = run_event(n=1)
        engine["run"]["facets"]["processing_engine"] = ENGINE
        assert httpx.post(route, json=engine, headers=auth).status_code == 200
        assert "START" in process.stdout.readline()  # the accepted event's line, no request line
        assert httpx.post(route, json=run_event(), headers=auth).status_code == 500
        batch = orjson.dumps([engine, engine])
        assert httpx.post(f"{route}/batch", content=batch, headers=auth).status_code == 404
        body = orjson.dumps(engine)
        assert httpx.post(route, content=body).status_code == 401
        assert httpx.post(route, content=b"{not json", headers=auth).status_code == 400
        assert httpx.get(f"{url}/api/v1/nothing").status_code == 404
        lines = read_lines(process, 5)
    finally:
        process.terminate()
        process.wait(5)
    assert (
        " 500 POST /openapi/openlineage/api/v1/lineage (1 event): Unable to determine orchestrator"
        in lines[0]
    )
    # A body that was not read as events is said by its size, not as "1 event".
    assert (
        f" 404 POST /openapi/openlineage/api/v1/lineage/batch ({len(batch):,} bytes): HTTP 404: no route"
        in lines[1]
    )
    assert f" 401 POST /openapi/openlineage/api/v1/lineage ({len(body):,} bytes): no bearer token" in lines[2]
    assert " 400 POST /openapi/openlineage/api/v1/lineage (9 bytes): " in lines[3]
    assert " 404 GET /api/v1/nothing: no route for GET /api/v1/nothing" in lines[4]


def test_the_sink_command_logs_accepted_requests_too_when_verbose():
    process, _, url = start_sink_command("--verbose", "--quiet")
    try:
        assert httpx.post(f"{url}/api/v1/lineage/batch", json=[run_event(), run_event()]).status_code == 200
        line = process.stdout.readline()
    finally:
        process.terminate()
        process.wait(5)
    assert " 200 POST /api/v1/lineage/batch (2 events): ok" in line
