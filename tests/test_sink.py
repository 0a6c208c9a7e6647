"""outbox sink: validation, storage, listing, the command line."""

import json
import re
import subprocess
import sys
import time

import httpx
import pytest

from outbox.tools.sink import Sink, validate_event

from helpers import run_event


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


def test_slow_switch_delays_answers():
    with Sink() as sink:
        sink.behaviour.delay = 0.2
        started = time.monotonic()
        httpx.post(f"{sink.url}/api/v1/lineage", json=run_event())
        assert time.monotonic() - started >= 0.2


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
    from outbox.tools.sink import _plainly_valid

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

    behaviour = SinkBehaviour(flavor="openmetadata", openmetadata_all_failed_status=all_failed_status)
    complete = {**run_event(state="COMPLETE"), "inputs": [{"namespace": "s3://b", "name": "k"}]}
    complete["outputs"] = [
        {"namespace": "trino://h:8080", "name": "c.s.t"},
        {"namespace": "n", "name": "s.t"},
    ]
    bad = run_event()
    bad["job"]["name"] = ""
    with Sink(behaviour=behaviour) as sink:
        base = f"{sink.url}/api/v1/openlineage/lineage"
        answer = httpx.post(base, json=complete)
        assert answer.status_code == 200
        assert answer.json()["lineageEdgesCreated"] == 2  # input x output
        assert httpx.post(base, json=run_event()).json()["lineageEdgesCreated"] == 0  # START, no outputs
        failed = httpx.post(f"{base}/batch", json={"events": [bad, bad]})
        assert failed.status_code == all_failed_status
        assert failed.json()["status"] == "failure"
        assert [f["index"] for f in failed.json()["failedEvents"]] == [0, 1]
        partial = httpx.post(f"{base}/batch", json={"events": [bad, complete]})
        assert partial.status_code == 200
        assert partial.json()["status"] == "partial_success"
