"""The DataEngine function on the outbox, run the way the platform runs it."""

import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time

import pytest

import outbox
from function.__main__ import expected, simulate
from outbox.tools.sink import Sink

import support.spec as spec
from support.helpers import refused_port, wait_until
from support.kafka_helpers import read_topic
from support.paths import REPO

ROOT = REPO
OBJECTS = ("docs-src/lineage-src/orders.csv", "docs-src/lineage-src/orders.bad")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no openlineage.yml
    for name in list(os.environ):
        if name.startswith(("OPENLINEAGE", "OUTBOX_")):
            monkeypatch.delenv(name)
    for name, value in {
        "VASTPIPELINE_PIPELINE_NAME": "lineage-demo",
        "VASTPIPELINE_FUNCTION_DEPLOYMENT_NAME": "lineagefn",
        "LINEAGE_NAMESPACE": "vast-dataengine://my-tenant",
        "OUTBOX_CLOSE_AT_EXIT": "false",
    }.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def fresh_module(name="function.main"):
    import importlib

    module = importlib.import_module(name)
    return importlib.reload(module)


def restore_sigterm():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_the_function_against_the_sink(clean_env):
    with Sink() as sink:
        clean_env.setenv("OPENLINEAGE_URL", sink.url)
        module, calls = simulate(OBJECTS, fresh_module())
        report = module.outbox.close(5)
        restore_sigterm()
        events = sink.events
    assert expected(calls) == []
    assert report.delivered == 4
    assert calls[1].error == "ValueError: cannot process lineage-src/orders.bad"  # re-raised
    assert sorted((e["inputs"][0]["name"], e["eventType"]) for e in events) == [
        ("lineage-src/orders.bad", "FAIL"),
        ("lineage-src/orders.bad", "START"),
        ("lineage-src/orders.csv", "COMPLETE"),
        ("lineage-src/orders.csv", "START"),
    ]
    for event in events:
        assert event["job"]["namespace"] == "vast-dataengine://my-tenant"
        assert event["job"]["name"] == "lineage-demo.lineagefn"
        assert event["job"]["facets"]["jobType"]["processingType"] == "STREAMING"
        assert event["job"]["facets"]["jobType"]["integration"] == "VAST_DATAENGINE"
        assert event["job"]["facets"]["jobType"]["jobType"] == "FUNCTION"
        assert event["inputs"][0]["namespace"] == "s3://docs-src"
        assert event["producer"] == "https://example.com/lineage-demo"
        assert event["outputs"] == []  # no LINEAGE_OUTPUTS
        engine = event["run"]["facets"]["processing_engine"]  # DataHub's "orchestrator"
        assert engine["name"] == "VAST_DATAENGINE"
        assert engine["version"] == "unknown"  # LINEAGE_ENGINE_VERSION not set
        assert engine["openlineageAdapterVersion"] == outbox.__version__
    by_key = {call.key: call for call in calls}
    for event in events:
        call = by_key[event["inputs"][0]["name"]]
        assert event["run"]["runId"] == call.run_id
        assert event["run"]["runId"].replace("-", "") == call.trace_id
    fail = next(e for e in events if e["eventType"] == "FAIL")
    facet = fail["run"]["facets"]["errorMessage"]
    assert facet["message"] == "cannot process lineage-src/orders.bad"
    assert facet["programmingLanguage"] == "python"
    assert "ValueError: cannot process lineage-src/orders.bad" in facet["stackTrace"]
    for event in events:
        spec.validate(event)


def test_lineage_outputs_name_the_datasets_each_run_writes(clean_env):
    clean_env.setenv(
        "LINEAGE_OUTPUTS",
        "trino://vast-trino:8080/vast.lineage.{bucket}_orders, s3://out-{bucket}/{object_key}.parquet",
    )
    clean_env.setenv("LINEAGE_ENGINE_VERSION", "5.3")
    with Sink() as sink:
        clean_env.setenv("OPENLINEAGE_URL", sink.url)
        module, _ = simulate(OBJECTS[:1], fresh_module())
        module.outbox.close(5)
        restore_sigterm()
        events = sink.events
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    assert events[0]["outputs"] == []  # an output exists once the work is done
    assert [(d["namespace"], d["name"]) for d in events[1]["outputs"]] == [
        ("trino://vast-trino:8080", "vast.lineage.docs-src_orders"),
        ("s3://out-docs-src", "lineage-src/orders.csv.parquet"),
    ]
    for event in events:
        assert event["run"]["facets"]["processing_engine"]["version"] == "5.3"
        assert event["inputs"][0]["facets"] == {}  # no LINEAGE_INPUT_TABLE


def test_lineage_input_table_names_the_table_of_each_input_object(clean_env):
    """The S3 input carries its table as a symlinks facet of type TABLE (what OpenMetadata
    resolves to a table); a failing run names no output anywhere."""
    clean_env.setenv("LINEAGE_INPUT_TABLE", "trino://vast-trino:8080/vast.lineage.{bucket}_raw")
    clean_env.setenv("LINEAGE_OUTPUTS", "trino://vast-trino:8080/vast.lineage.{bucket}_orders")
    with Sink() as sink:
        clean_env.setenv("OPENLINEAGE_URL", sink.url)
        module, calls = simulate(OBJECTS, fresh_module())
        module.outbox.close(5)
        restore_sigterm()
        events = sink.events
    assert expected(calls) == []
    for event in events:
        (source,) = event["inputs"]
        assert (source["namespace"], source["name"]) == ("s3://docs-src", event["inputs"][0]["name"])
        assert source["facets"]["symlinks"]["identifiers"] == [
            {"namespace": "trino://vast-trino:8080", "name": "vast.lineage.docs-src_raw", "type": "TABLE"}
        ]
        spec.validate(event)
    outputs = {(e["inputs"][0]["name"], e["eventType"]): e["outputs"] for e in events}
    assert outputs == {
        ("lineage-src/orders.csv", "START"): [],
        ("lineage-src/orders.csv", "COMPLETE"): [
            {
                "namespace": "trino://vast-trino:8080",
                "name": "vast.lineage.docs-src_orders",
                "facets": {},
                "outputFacets": {},
            }
        ],
        ("lineage-src/orders.bad", "START"): [],
        ("lineage-src/orders.bad", "FAIL"): [],
    }


@pytest.mark.parametrize(
    "table", ["vast.lineage.raw", "trino://h:8080/a.b.c, trino://h:8080/d.e.f", "s3://b/{region}/x"]
)
def test_a_bad_lineage_input_table_fails_init_naming_it(clean_env, table):
    clean_env.setenv("LINEAGE_INPUT_TABLE", table)
    with pytest.raises(ValueError, match="LINEAGE_INPUT_TABLE"):
        simulate(OBJECTS[:1], fresh_module())


def test_the_function_reaches_datahub_with_the_readme_settings(clean_env):
    """Released DataHub: one route, and 500 to events that name no orchestrator; the function's
    processing_engine facet names one."""
    from outbox.tools.sink import SinkBehaviour

    with Sink(behaviour=SinkBehaviour(flavor="datahub")) as sink:
        clean_env.setenv("OPENLINEAGE__TRANSPORT__TYPE", "http")
        clean_env.setenv("OPENLINEAGE__TRANSPORT__URL", f"{sink.url}/openapi/openlineage/")
        clean_env.setenv("OPENLINEAGE__TRANSPORT__MODE", "single")
        module, _ = simulate(OBJECTS, fresh_module())
        report = module.outbox.close(5)
        restore_sigterm()
        statuses = [status for _, status, _ in sink.requests]
    assert report.delivered == 4, report
    assert statuses == [200] * 4


@pytest.mark.parametrize(
    "outputs", ["vast.lineage.orders", "trino://host:8080", "s3://b/{bucket", "s3://b/{region}/x", "://b/x"]
)
def test_a_bad_lineage_outputs_fails_init_naming_it(clean_env, outputs):
    clean_env.setenv("LINEAGE_OUTPUTS", outputs)
    clean_env.setenv("OPENLINEAGE_DISABLED", "true")
    module = fresh_module()
    with pytest.raises(ValueError, match=r"LINEAGE_OUTPUTS: .* is not a dataset URI such as trino://"):
        module.init(type("Ctx", (), {"logger": None})())


def test_a_down_backend_does_not_slow_the_handler(clean_env):
    objects = [f"docs-src/lineage-src/o{i}.csv" for i in range(200)]
    clean_env.setenv("OPENLINEAGE_DISABLED", "true")
    module, off = simulate(objects, fresh_module())
    module.outbox.close(1)
    clean_env.delenv("OPENLINEAGE_DISABLED")
    clean_env.setenv("OPENLINEAGE_URL", f"http://127.0.0.1:{refused_port()}")  # connection refused
    module, down = simulate(objects, fresh_module())
    assert wait_until(lambda: module.outbox.stats().retried > 0, 10)  # it really tried the dead backend
    stats = module.outbox.stats()
    module.outbox.close(0.2)
    restore_sigterm()
    assert stats.delivered == 0
    median_off = statistics.median(c.seconds for c in off[20:])
    median_down = statistics.median(c.seconds for c in down[20:])
    # Loose on purpose (a shared machine): a blocking client would add seconds per call.
    assert median_down < 5 * median_off + 0.002, (median_off, median_down)


def test_the_kafka_pipeline_variables(clean_env, kafka_bootstrap, topic):
    clean_env.setenv("OPENLINEAGE__TRANSPORT__TYPE", "kafka")
    clean_env.setenv("OPENLINEAGE__TRANSPORT__TOPIC", topic)
    clean_env.setenv(
        "OPENLINEAGE__TRANSPORT__CONFIG", json.dumps({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    )
    module, calls = simulate(OBJECTS, fresh_module())
    report = module.outbox.close(10)
    restore_sigterm()
    assert report.delivered == 4
    records = read_topic(kafka_bootstrap, topic, 4)
    assert {r["key"] for r in records} == {"run:vast-dataengine://my-tenant/lineage-demo.lineagefn"}
    assert sorted(r["event"]["eventType"] for r in records) == ["COMPLETE", "FAIL", "START", "START"]
    assert expected(calls) == []


def test_the_unchanged_openlineage_client_handler_through_outbox_transport(clean_env):
    with Sink() as sink:
        clean_env.setenv("OPENLINEAGE__TRANSPORT__TYPE", "outbox.OutboxTransport")
        clean_env.setenv("OPENLINEAGE_URL", sink.url)
        module, calls = simulate(OBJECTS, fresh_module("support.seed_lineagefn"))
        assert type(module.client.transport).__name__ == "OutboxTransport"
        module.client.close(5)
        events = sink.events
    assert sorted(e["eventType"] for e in events) == ["COMPLETE", "FAIL", "START", "START"]
    assert {e["run"]["runId"].replace("-", "") for e in events} == {c.trace_id for c in calls}
    assert calls[1].error == "ValueError: cannot process lineage-src/orders.bad"


def test_outbox_transport_sends_each_event_as_it_was_when_emitted(clean_env):
    # openlineage-python's transports write the event in emit: code written for them may change
    # it afterwards.  Through OutboxTransport the START went out with the COMPLETE's inputs (the
    # sidecar wrote the shared list later), and a dict emitted twice as two states went twice.
    from openlineage.client import OpenLineageClient
    from openlineage.client.event_v2 import InputDataset, Job, Run, RunEvent, RunState

    with Sink() as sink:
        clean_env.setenv("OPENLINEAGE__TRANSPORT__TYPE", "outbox.OutboxTransport")
        clean_env.setenv("OPENLINEAGE_URL", sink.url)
        clean_env.setenv("OUTBOX_LINGER", "30")  # (the sidecar writes nothing before the close)
        client = OpenLineageClient()
        inputs = [InputDataset(namespace="s3://bucket", name="first.csv")]
        run, job = Run(runId="0191c5b8-3c8a-7c2e-9f00-000000000001"), Job(namespace="ns", name="job")
        common = {"run": run, "job": job, "producer": "https://example.com/p", "inputs": inputs}
        client.emit(RunEvent(eventType=RunState.START, eventTime="2026-12-07T10:00:00Z", **common))
        inputs.append(InputDataset(namespace="s3://bucket", name="found-later.csv"))
        client.emit(RunEvent(eventType=RunState.COMPLETE, eventTime="2026-12-07T10:00:01Z", **common))
        client.close(5)
        events = sink.events
    named = {e["eventType"]: [i["name"] for i in e["inputs"]] for e in events}
    assert named == {"START": ["first.csv"], "COMPLETE": ["first.csv", "found-later.csv"]}


SUBPROCESS = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from function.__main__ import simulate
    if sys.argv[1] == "chained":
        def runtime_handler(signum, frame):
            open({marker!r}, "w").write("runtime handler ran")
            sys.exit(0)
        signal.signal(signal.SIGTERM, runtime_handler)
    module, calls = simulate(["docs-src/lineage-src/orders.csv", "docs-src/lineage-src/orders.bad"])
    if sys.argv[1] == "exit":
        sys.exit(0)  # no close(): the exit hook flushes
    os.kill(os.getpid(), signal.SIGTERM)
    import time; time.sleep(30)
    """
)


@pytest.mark.parametrize("how", ["exit", "sigterm", "chained"])
def test_exit_and_sigterm_flush(clean_env, tmp_path, how):
    marker = tmp_path / "marker"
    code = SUBPROCESS.format(root=str(ROOT), marker=str(marker))
    with Sink() as sink:
        env = {
            **os.environ,
            "OPENLINEAGE_URL": sink.url,
            "OUTBOX_LINGER": "30",
            "OUTBOX_CLOSE_AT_EXIT": "true",
        }
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-c", code, how], env=env, capture_output=True, text=True, timeout=60
        )
        # Under the child's 30 s sleep (and its 30 s linger), whatever its start-up took: that
        # alone can take 10-20 s beside load, so 20 s was a bound the machine could break.
        assert time.monotonic() - started < 30
        events = sink.events
    assert len(events) == 4, result.stderr  # the 30 s linger never elapsed: the flush sent them
    if how == "exit":
        assert result.returncode == 0
    elif how == "sigterm":
        assert result.returncode == -signal.SIGTERM  # the default action, handed on
    else:
        assert result.returncode == 0
        assert marker.read_text() == "runtime handler ran"  # chained, not replaced


def test_the_openmetadata_pipeline_file_delivers_events_with_outputs(clean_env):
    """function/lineage-demo-openmetadata.yaml's environment, its placeholders pointed at
    outbox sink's openmetadata flavour (its routes, batch body and bearer token): every event
    is delivered, and by the server's rules the successful run's COMPLETE draws the one edge
    input table -> output table (its input resolves through the TABLE symlink), every other
    event none; without LINEAGE_INPUT_TABLE, none at all."""
    import yaml

    from outbox.tools.sink import SinkBehaviour, openmetadata_single_answer

    tables = ("trino.vast.lineage.docs-src_raw", "trino.vast.lineage.docs-src_orders")

    pipeline = yaml.safe_load((ROOT / "function" / "lineage-demo-openmetadata.yaml").read_text())
    variables = pipeline["manifest"]["function_deployments"][0]["config"]["environment_variables"]
    with Sink(behaviour=SinkBehaviour(flavor="openmetadata", api_key="bot-jwt")) as sink:
        for variable in variables:
            value = variable["value"].replace("http://<openmetadata host>:8585", sink.url)
            clean_env.setenv(variable["name"], value.replace("<the bot JWT>", "bot-jwt"))
        module, _ = simulate(OBJECTS, fresh_module())
        report = module.outbox.close(5)
        restore_sigterm()
        events = sink.events
        answers = sink.requests
    assert report.delivered == 4
    complete = next(e for e in events if e["eventType"] == "COMPLETE")
    assert [(d["namespace"], d["name"]) for d in complete["outputs"]] == [
        ("trino://vast-trino:8080", "vast.lineage.docs-src_orders")
    ]
    assert all(path.startswith("/api/v1/openlineage/lineage") for path, _, _ in answers)
    edges = {
        (e["inputs"][0]["name"], e["eventType"]): openmetadata_single_answer(e, tables)["lineageEdgesCreated"]
        for e in events
    }
    assert edges == {
        ("lineage-src/orders.csv", "START"): 0,
        ("lineage-src/orders.csv", "COMPLETE"): 1,
        ("lineage-src/orders.bad", "START"): 0,
        ("lineage-src/orders.bad", "FAIL"): 0,
    }
    complete["inputs"][0]["facets"] = {}  # as the pipeline file sent it without LINEAGE_INPUT_TABLE
    assert openmetadata_single_answer(complete, tables)["lineageEdgesCreated"] == 0
