"""End to end against a real Marquez 0.51.1 (started by the harness, or MARQUEZ_URL): what its
own API says arrived, not what our stand-in says."""

from __future__ import annotations

import asyncio
import gzip
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest

from e2e.peers import serving
from outbox import LineageJob, Outbox, s3_dataset
from outbox.tools.forward import Forwarder
from outbox.tools.sink import Sink, SinkBehaviour
from outbox.transports import HttpTransport

from support.helpers import run_event, wait_until
from support.kafka_helpers import committed_offsets, create_topic, produce

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
FAST = {"backoff_base": 0.05, "backoff_cap": 0.5, "linger": 0.01, "close_at_exit": False}


def enc(text: str) -> str:
    return quote(text, safe="")


def stored_events(marquez: Any, namespace: str) -> list[dict[str, Any]]:
    """Every lineage event Marquez stored for jobs in ``namespace``, oldest first: in one page.
    Marquez orders a page by event time alone (``ORDER BY event_time LIMIT OFFSET``), and the
    suite's events share their times, so two pages cut by an offset could each order a tie
    differently: an event in both, or in neither (12 missing, once, beside load)."""
    limit = 5000
    while True:
        page = marquez.get("/api/v1/events/lineage", limit=limit, sortDirection="asc")["events"]
        if len(page) < limit:
            return [e for e in page if (e.get("job") or {}).get("namespace") == namespace]
        limit *= 4


def event(namespace: str, run_id: str, n: int, state: str = "START", **changes: Any) -> dict[str, Any]:
    body = run_event(run_id=run_id, state=state, n=n, job=f"job-{run_id[:8]}")
    body["job"]["namespace"] = namespace
    body["eventTime"] = f"2026-12-02T10:{n // 60 % 60:02d}:{n % 60:02d}.000000+00:00"
    body["run"]["facets"] = {
        "n": {"_producer": "https://example.com/tests", "_schemaURL": "https://example.com/n", "n": n}
    }
    del body["n"]  # Marquez keeps unknown top-level keys out of what it stores: carry n in a facet
    body.update(changes)
    return body


def number(stored: dict[str, Any]) -> int:
    return int(stored["run"]["facets"]["n"]["n"])


def in_order(events: list[dict[str, Any]]) -> bool:
    """Per run, first occurrences in emission order (Marquez stores in arrival order)."""
    runs: dict[str, list[int]] = {}
    for stored in events:
        runs.setdefault(stored["run"]["runId"], []).append(number(stored))
    return all(list(dict.fromkeys(ns)) == sorted(dict.fromkeys(ns)) for ns in runs.values())


# -- the function, as users run it ----------------------------------------------------------


def test_the_function_in_auto_mode_shows_up_in_marquez(marquez):
    result = subprocess.run(
        [sys.executable, "-m", "function"],
        cwd=ROOT,
        env={**os.environ, "OPENLINEAGE_URL": marquez.url, "OUTBOX_SHUTDOWN_TIMEOUT": "30"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout + result.stderr
    printed = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].startswith("docs-src/"):
            printed[parts[0]] = (parts[1], parts[2], parts[3])
    (ok, trace_ok, run_ok), (fail, trace_fail, run_fail) = (
        printed["docs-src/lineage-src/orders.csv"],
        printed["docs-src/lineage-src/orders.bad"],
    )
    assert (ok, fail) == ("ok", "FAIL")
    assert uuid.UUID(run_ok).hex == trace_ok
    assert uuid.UUID(run_fail).hex == trace_fail
    # Auto mode found no batch route and said so once.
    assert output.count("no batch endpoint there") == 1, output

    namespace, job = "vast-dataengine://my-tenant", "lineage-demo.lineagefn"
    runs = marquez.get(f"/api/v1/namespaces/{enc(namespace)}/jobs/{enc(job)}/runs", limit=1000)["runs"]
    by_id = {r["id"]: r for r in runs}
    assert by_id[run_ok]["state"] == "COMPLETED"
    assert by_id[run_fail]["state"] == "FAILED"
    error = by_id[run_fail]["facets"]["errorMessage"]
    assert "cannot process lineage-src/orders.bad" in error["message"]
    for key in ("lineage-src/orders.csv", "lineage-src/orders.bad"):
        dataset = marquez.get(f"/api/v1/namespaces/{enc('s3://docs-src')}/datasets/{enc(key)}")
        assert dataset["namespace"] == "s3://docs-src"
    # Marquez draws a job's graph from its current version: the inputs of the run it processed
    # last (the two runs travel in different lanes, so which one that is may vary).
    current = marquez.get(f"/api/v1/namespaces/{enc(namespace)}/jobs/{enc(job)}")["inputs"]
    inputs = {f"dataset:{d['namespace']}:{d['name']}" for d in current}
    assert inputs, current
    assert inputs <= {
        "dataset:s3://docs-src:lineage-src/orders.csv",
        "dataset:s3://docs-src:lineage-src/orders.bad",
    }
    graph = marquez.get("/api/v1/lineage", nodeId=f"job:{namespace}:{job}", depth=5)["graph"]
    nodes = {node["id"] for node in graph}
    assert {f"job:{namespace}:{job}", *inputs} <= nodes


# -- what Marquez refuses -------------------------------------------------------------------


def test_an_event_marquez_answers_422_is_rejected_and_the_others_delivered(marquez):
    namespace = f"e2e-422-{uuid.uuid4().hex[:8]}"
    outbox = Outbox(HttpTransport(marquez.url, mode="single"), **FAST)
    runs = [str(uuid.uuid4()) for _ in range(5)]
    bad = event(namespace, runs[2], 0)
    del bad["run"]  # {"errors": ["run must not be null"]}
    for n in range(3):
        for r, run_id in enumerate(runs):
            outbox.emit(bad if (r, n) == (2, 0) else event(namespace, run_id, n))
    report = outbox.close(60)
    assert report.undelivered == {"rejected_by_backend": 1}, report
    stored = stored_events(marquez, namespace)
    assert sorted((e["run"]["runId"], number(e)) for e in stored) == sorted(
        (run_id, n) for n in range(3) for r, run_id in enumerate(runs) if (r, n) != (2, 0)
    )


def test_an_event_marquez_answers_500_is_isolated_as_poison_and_its_run_goes_on(marquez):
    namespace = f"e2e-poison-{uuid.uuid4().hex[:8]}"
    outbox = Outbox(HttpTransport(marquez.url, mode="auto"), **FAST)
    runs = [str(uuid.uuid4()) for _ in range(20)]
    started = time.monotonic()
    for n in range(3):
        for r, run_id in enumerate(runs):
            changes = {"eventTime": "2026-12-02"} if (r, n) == (7, 0) else {}  # no time part: 500
            outbox.emit(event(namespace, run_id, n, **changes))
    assert outbox.flush(60), outbox.stats()
    took = time.monotonic() - started
    stats = outbox.stats()
    outbox.close(5)
    assert stats.dropped == {"poison": 1}, stats
    assert stats.circuit == "closed"
    assert took < 20, took
    stored = stored_events(marquez, namespace)
    delivered = {(e["run"]["runId"], number(e)) for e in stored}
    assert delivered == {(run_id, n) for n in range(3) for r, run_id in enumerate(runs) if (r, n) != (7, 0)}
    assert {(runs[7], 1), (runs[7], 2)} <= delivered  # the later events of its run
    assert in_order(stored)


def test_marquez_stopped_and_started_mid_stream_loses_nothing(marquez):
    if marquez.external:
        pytest.skip("MARQUEZ_URL names a Marquez the suite does not own: it cannot restart it")
    namespace = f"e2e-restart-{uuid.uuid4().hex[:8]}"
    outbox = Outbox(HttpTransport(marquez.url, mode="single", timeout=2.0), max_events=100_000, **FAST)
    runs = [str(uuid.uuid4()) for _ in range(10)]
    worst = 0.0
    sent = 0

    def emit_some(count: int) -> None:
        nonlocal worst, sent
        for _ in range(count):
            run_id, n = runs[sent % len(runs)], sent // len(runs)
            started = time.monotonic()
            assert outbox.emit(event(namespace, run_id, n))
            worst = max(worst, time.monotonic() - started)
            sent += 1

    emit_some(100)
    assert wait_until(lambda: outbox.stats().delivered == 100, 30), outbox.stats()
    marquez.stop()
    emit_some(200)  # while Marquez is down
    time.sleep(1.0)
    assert outbox.stats().delivered == 100
    marquez.start()  # same database, same port
    emit_some(100)
    report = outbox.close(90)
    assert report.complete, report
    assert worst < 0.5, worst  # emit never waited for the backend
    stored = stored_events(marquez, namespace)
    assert {(e["run"]["runId"], number(e)) for e in stored} == {
        (runs[i % len(runs)], i // len(runs)) for i in range(400)
    }
    assert in_order(stored)


# -- Kafka to Marquez through outbox forward ------------------------------------------------


def run_forwarder(bootstrap: str, topic: str, url: str, stop_when: Any, **options: Any) -> Forwarder:
    forwarder = Forwarder(
        {"bootstrap.servers": bootstrap},
        topic,
        HttpTransport(url, mode="single"),
        group_id=f"{topic}-group",
        session_timeout=6.0,
        progress_interval=0,
        **options,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(forwarder.run()))
    thread.start()
    try:
        assert wait_until(lambda: stop_when(forwarder), 120), forwarder.stats
    finally:
        loop.call_soon_threadsafe(forwarder.stop)
        thread.join(60)
        loop.close()
    return forwarder


def test_apache_kafka_to_outbox_forward_to_marquez(apache_kafka, marquez):
    namespace = f"e2e-forward-{uuid.uuid4().hex[:8]}"
    topic = f"e2e-marquez-{uuid.uuid4().hex[:8]}"
    create_topic(apache_kafka.bootstrap_servers, topic, partitions=3)
    runs = [str(uuid.uuid4()) for _ in range(50)]
    total = 1000
    events = [event(namespace, runs[i % 50], i // 50) for i in range(total)]
    produce(
        apache_kafka.bootstrap_servers,
        topic,
        [orjson.dumps(e) for e in events],
        keys=[f"run:{namespace}/{e['job']['name']}".encode() for e in events],
    )
    # A first forwarder is stopped part way with no time to finish the records in hand (as a
    # restart cuts it short); a second one takes over from the committed offsets.
    servers = apache_kafka.bootstrap_servers
    first = run_forwarder(
        servers, topic, marquez.url, lambda f: f.stats.delivered >= 100, max_records=50, drain_timeout=0
    )
    assert first.stats.delivered < total
    second = run_forwarder(
        servers,
        topic,
        marquez.url,
        lambda f: committed_offsets(servers, topic, f"{topic}-group") == total,
    )
    assert first.stats.delivered + second.stats.delivered >= total  # at least once
    stored = stored_events(marquez, namespace)
    assert {(e["run"]["runId"], number(e)) for e in stored} == {(runs[i % 50], i // 50) for i in range(total)}
    assert in_order(stored)


# -- the real-backend figure ------------------------------------------------------------------


def test_invocations_of_the_run_helpers_reach_marquez(marquez):
    """``LINEAGE_OUTBOX_E2E_RUNS=2000 pytest -m e2e tests/e2e -k invocations -s`` prints the figure
    docs/benchmarks.md quotes.  CI runs 500 (its Marquez runs beside the other suites: at about
    40 events/s, 2,000 runs are 100 s of its CPU)."""
    count = int(os.environ.get("LINEAGE_OUTBOX_E2E_RUNS", "500"))
    namespace = f"e2e-volume-{uuid.uuid4().hex[:8]}"
    job = LineageJob(namespace, "volume", producer="https://example.com/tests")
    outbox = Outbox(HttpTransport(marquez.url, mode="auto"), max_events=100_000, close_at_exit=False)
    started = time.monotonic()
    for i in range(count):
        with outbox.run(job, inputs=[s3_dataset("docs-src", f"volume/{i}.csv")]):
            pass
    report = outbox.close(300)
    took = time.monotonic() - started
    assert report.complete, report
    assert report.delivered == 2 * count
    runs = marquez.get(f"/api/v1/namespaces/{enc(namespace)}/jobs/volume/runs", limit=count)["runs"]
    assert len(runs) == count
    assert {r["state"] for r in runs} == {"COMPLETED"}
    print(
        f"\nMarquez {marquez.url}: {2 * count:,} events ({count:,} runs) delivered in {took:.1f} s: "
        f"{2 * count / took:,.0f} events/s"
    )


# -- the stand-in, held to the real thing -----------------------------------------------------


def probe_requests() -> dict[str, tuple[str, bytes, dict[str, str]]]:
    def body(**changes: Any) -> bytes:
        e = event("e2e-conformance", str(uuid.uuid4()), 0)
        for key, value in changes.items():
            if value is None:
                e.pop(key, None)
            else:
                e[key] = value
        return orjson.dumps(e)

    json_type = {"Content-Type": "application/json"}
    single, batch = "/api/v1/lineage", "/api/v1/lineage/batch"
    return {
        "valid": (single, body(), json_type),
        "valid complete": (single, body(eventType="COMPLETE"), json_type),
        "json with charset": (single, body(), {"Content-Type": "application/json; charset=utf-8"}),
        "gzip": (single, gzip.compress(body()), {**json_type, "Content-Encoding": "gzip"}),
        "no run": (single, body(run=None), json_type),
        "no job": (single, body(job=None), json_type),
        "no producer": (single, body(producer=None), json_type),
        "no eventTime": (single, body(eventTime=None), json_type),
        "empty object": (single, b"{}", json_type),
        "null body": (single, b"null", json_type),
        "empty body": (single, b"", json_type),
        "no runId": (single, body(run={}), json_type),
        "no job name": (single, body(job={"namespace": "x"}), json_type),
        "input without a name": (single, body(inputs=[{"namespace": "s3://b"}]), json_type),
        "date without a time": (single, body(eventTime="2026-12-02"), json_type),
        "not a time": (single, body(eventTime="not-a-time"), json_type),
        "time without an offset": (single, body(eventTime="2026-12-02T10:00:00"), json_type),
        "run id not a UUID": (single, body(run={"runId": "not-a-uuid"}), json_type),
        "unknown eventType": (single, body(eventType="FOO"), json_type),
        "parent without a run id": (
            single,
            body(
                run={
                    "runId": str(uuid.uuid4()),
                    "facets": {
                        "parent": {"_producer": "p", "_schemaURL": "s", "run": {}, "job": {"namespace": "a"}}
                    },
                }
            ),
            json_type,
        ),
        "truncated JSON": (single, b'{"eventType": "START", "eventTime": ', json_type),
        "not JSON": (single, b"not json", json_type),
        "an array": (single, b"[]", json_type),
        "the batch route": (batch, b"[" + body() + b"," + body() + b"]", json_type),
        "no content type": (single, body(), {}),
        "text/plain": (single, body(), {"Content-Type": "text/plain"}),
    }


def test_the_marquez_flavour_of_outbox_sink_answers_as_marquez_does(marquez):
    requests = probe_requests()
    with serving(Sink(behaviour=SinkBehaviour(flavor="marquez"))) as sink:
        differences = []
        for name, (path, content, headers) in requests.items():
            real = httpx.post(marquez.url + path, content=content, headers=headers, timeout=30)
            ours = httpx.post(sink.url + path, content=content, headers=headers, timeout=30)
            if real.status_code != ours.status_code:
                differences.append(
                    f"{name}: Marquez {real.status_code} {real.text[:120]!r}, sink {ours.status_code}"
                )
                continue
            if real.status_code == 201:
                assert real.content == ours.content == b"", name
            elif real.status_code == 422:
                assert set(real.json()["errors"]) == set(ours.json()["errors"]), name
            elif real.status_code == 500:
                assert real.json()["code"] == ours.json()["code"] == 400, name
    assert not differences, "\n".join(differences)


def test_outbox_check_passes_against_marquez_and_writes_nothing(marquez):
    # The answer check's empty event is one of probe_requests() ("empty object"): 422 there too.
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_"))}
    done = subprocess.run(
        [sys.executable, "-m", "outbox.tools.cli", "check"],
        env={**clean, "OPENLINEAGE_URL": marquez.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    answer = next(line for line in done.stdout.splitlines() if line.split()[1:2] == ["answer"])
    assert answer.startswith("ok")
    assert ": 422," in answer
