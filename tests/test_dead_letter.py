"""The dead-letter file and ``outbox replay`` (a real HTTP backend on loopback)."""

import json
import os
import subprocess
import sys

import pytest

from outbox import ConfigError, Outbox
from outbox.tools.sink import Sink, SinkBehaviour
from outbox.transports import HttpTransport

from helpers import run_event


def test_every_event_settled_for_good_leaves_a_trace_in_the_dead_letter_file(tmp_path):
    path = tmp_path / "dead.jsonl"
    with Sink(behaviour=SinkBehaviour(poison="POISON")) as sink:
        outbox = Outbox(
            HttpTransport(sink.url, mode="single"),
            dead_letter=path,
            max_batch_bytes=50_000,
            linger=0.01,
            close_at_exit=False,
        )
        bad = run_event(n=1)
        bad["run"]["runId"] = "not-a-uuid"  # 422
        poison = run_event(n=2, job="POISON")  # 500, alone, while others go through
        unserializable = run_event(n=3)
        unserializable["run"]["facets"] = {"x": {"_producer": "p", "_schemaURL": "s", "v": object()}}
        big = run_event(n=4)
        big["run"]["facets"] = {"x": {"_producer": "p", "_schemaURL": "s", "v": "x" * 60_000}}
        for event in (run_event(n=0), bad, poison, unserializable, big, run_event(n=5)):
            assert outbox.emit(event)
        report = outbox.close(30)
    assert report.delivered == 2
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    by_reason = {line["reason"]: line for line in lines}
    assert sorted(by_reason) == ["invalid_event", "poison", "rejected_by_backend", "too_large"]
    assert dict(report.undelivered) == {reason: 1 for reason in by_reason}
    assert by_reason["rejected_by_backend"]["event"]["n"] == 1
    assert "422" in by_reason["rejected_by_backend"]["answer"]
    assert by_reason["poison"]["event"]["n"] == 2
    assert "500" in by_reason["poison"]["answer"]
    assert by_reason["too_large"]["event"]["n"] == 4
    assert "object" in by_reason["invalid_event"]["event_repr"]
    assert all(line["time"].startswith("20") for line in lines)


def test_outbox_replay_sends_a_dead_letter_file_again(tmp_path):
    path = tmp_path / "dead.jsonl"
    with Sink() as sink:
        # Too large for this outbox's batches: dead-lettered with their whole JSON.
        outbox = Outbox(
            HttpTransport(sink.url, mode="batch"), dead_letter=path, max_batch_bytes=2000, close_at_exit=False
        )
        for n in range(3):
            event = run_event(n=n)
            event["run"]["facets"] = {"x": {"_producer": "p", "_schemaURL": "s", "v": "x" * 3000}}
            outbox.emit(event)
        outbox.emit(run_event(n=9))
        report = outbox.close(10)
    assert report.undelivered == {"too_large": 3}, report
    assert len(path.read_text().splitlines()) == 3
    # Plain events in the same file are replayed too.
    with path.open("a") as file:
        file.write(json.dumps(run_event(n=7)) + "\n\n")
    with Sink() as fixed:  # replayed by an outbox with the default max_batch_bytes (1 MiB)
        env = {**os.environ, "OPENLINEAGE_URL": fixed.url}
        env.pop("OUTBOX_DEAD_LETTER", None)
        result = subprocess.run(
            [sys.executable, "-m", "outbox.tools.cli", "replay", str(path), "--timeout", "10"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        arrived = sorted(e["n"] for e in fixed.events)
    assert result.returncode == 0, result.stderr
    assert "replayed 4 events: delivered 4, lost none" in result.stdout
    assert arrived == [0, 1, 2, 7]


def test_dead_letter_in_a_missing_folder_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        Outbox(HttpTransport("http://127.0.0.1:9"), dead_letter=tmp_path / "nope" / "dead.jsonl")
    outbox = Outbox.from_env({"OUTBOX_DEAD_LETTER": str(tmp_path / "d.jsonl")}, close_at_exit=False)
    assert outbox._dead_letter is not None
    outbox.close(0)
