"""``outbox replay``, run as an operator runs it (a process, its environment): a dead-letter file
sent again to a real HTTP backend on loopback, at least once, a rerun sending only what the last
run did not deliver, within its deadline."""

import fcntl
import json
import time
from pathlib import Path

import orjson

from outbox import Outbox
from outbox._observability._deadletter import DeadLetter
from outbox.tools.sink import Sink, SinkBehaviour
from outbox.transports import HttpTransport

from support.dead_letters import records, replay
from support.helpers import refused_port, run_event


def test_outbox_replay_sends_a_dead_letter_file_again_and_a_second_run_sends_nothing(tmp_path):
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
        first = replay(path, fixed.url, "--timeout", "10")
        again = replay(path, fixed.url, "--timeout", "10")
        arrived = sorted(e["n"] for e in fixed.events)
    assert first.returncode == 0, first.stderr
    assert f"replayed 4 events from {path}: delivered 4, none left undelivered" in first.stdout
    assert arrived == [0, 1, 2, 7]  # once: the second run found them recorded
    assert again.returncode == 0, again.stderr
    assert "replayed 0 events" in again.stdout
    assert "4 delivered by an earlier run, skipped" in again.stdout


def test_a_second_replay_sends_only_what_the_first_did_not_deliver(tmp_path):
    path = tmp_path / "dead.jsonl"
    events = [("rejected_by_backend", "400", orjson.dumps(run_event(n=n)), None) for n in range(40)]
    events += [("poison", "500", orjson.dumps(run_event(n=n, job="POISON")), None) for n in range(40, 50)]
    DeadLetter(path).write(events)
    with Sink(behaviour=SinkBehaviour(poison="POISON")) as sink:
        first = replay(path, sink.url, "--timeout", "20", env={"OUTBOX_POISON_ATTEMPTS": "1"})
        delivered_first = sorted(e["n"] for e in sink.events)
        sink.behaviour.poison = None  # the backend fixed
        second = replay(path, sink.url, "--timeout", "20")
        arrived = [e["n"] for e in sink.events]
    assert delivered_first == list(range(40))
    assert first.returncode == 1, first.stdout + first.stderr
    # Not "lost": what was not delivered stays in the file, and the second run sends it.
    assert f"delivered 40, 10 not delivered (poison: 10), left in {path} for the next run" in first.stdout
    assert "lost" not in first.stdout
    assert second.returncode == 0, second.stdout + second.stderr
    assert sorted(arrived) == list(range(50))  # every event once: no duplicates of the 40
    assert "replayed 10 events" in second.stdout
    assert "40 delivered by an earlier run" in second.stdout


def test_replay_keeps_its_deadline_whatever_the_buffer_size_and_the_next_run_sends_the_rest(tmp_path):
    path = tmp_path / "dead.jsonl"
    DeadLetter(path).write(records(0, 50))
    down = f"http://127.0.0.1:{refused_port()}"
    small = {"OUTBOX_MAX_EVENTS": "10", "OUTBOX_MAX_BATCH_EVENTS": "5"}
    started = time.monotonic()
    cut = replay(path, down, "--timeout", "3", env=small)
    took = time.monotonic() - started
    assert cut.returncode == 1, cut.stderr
    assert 3 <= took < 20  # used its time, and kept it (each event beyond 10 waited 60 s before)
    assert "40 not sent by the deadline (--timeout 3): run again to send them" in cut.stdout, cut.stdout
    # The wait said what it waited for, once, while it waited (on stderr).
    assert cut.stderr.count("outbox replay: still sending to HttpTransport(") == 1, cut.stderr
    assert "(--timeout 3) for it to take the events" in cut.stderr
    assert "dropped_shutdown" in cut.stdout
    with Sink() as sink:
        rest = replay(path, sink.url, "--timeout", "30", env=small)
        arrived = sorted(e["n"] for e in sink.events)
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert arrived == list(range(50))


def test_replay_refuses_to_run_without_a_configured_backend_unless_asked_for_the_console(tmp_path):
    path = tmp_path / "dead.jsonl"
    DeadLetter(path).write(records(0, 3))
    refused = replay(path)
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert "no lineage backend is configured: set OPENLINEAGE_URL" in refused.stderr
    assert "--console" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    disabled = replay(path, env={"OPENLINEAGE_DISABLED": "true"})
    assert disabled.returncode == 2
    assert "lineage is disabled" in disabled.stderr
    shown = replay(path, None, "--console")
    assert shown.returncode == 0, shown.stderr
    # Standard output is the events alone (for jq and the like); the summary is on stderr.
    printed = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [e["n"] for e in printed] == [0, 1, 2]
    assert "replayed 3 events" in shown.stderr
    assert not Path(str(path) + ".replayed").exists()  # a look at the file delivers nothing
    with Sink() as sink:
        assert replay(path, sink.url).returncode == 0
        assert len(sink.events) == 3


def test_replay_reads_a_file_written_before_records_had_a_frame(tmp_path):
    path = tmp_path / "old.jsonl"
    old = [
        {"time": "2026-12-02T10:00:00+00:00", "reason": "poison", "answer": "500", "event": run_event(n=n)}
        for n in range(3)
    ]
    lines = [orjson.dumps(r) for r in old]
    invalid = {
        "time": "2026-12-02T10:00:00+00:00",
        "reason": "invalid_event",
        "answer": "",
        "event_repr": "x",
    }
    # The old writer glued a record onto a torn one: the record is found again.
    glued = b'{"time":"2026-12-02T10:00:00+00:00","reason":"po' + orjson.dumps(
        {"time": "2026-12-02T10:00:01+00:00", "reason": "poison", "answer": "500", "event": run_event(n=3)}
    )
    path.write_bytes(b"\n".join([*lines, orjson.dumps(invalid), glued]) + b"\n")
    with Sink() as sink:
        result = replay(path, sink.url)
        arrived = sorted(e["n"] for e in sink.events)
    assert result.returncode == 0, result.stderr
    assert arrived == [0, 1, 2, 3]
    assert "1 torn record(s)" in result.stderr
    assert "1 record(s) hold no JSON event" in result.stdout


def test_replay_of_a_missing_file_or_an_unwritable_progress_is_a_short_error(tmp_path):
    missing = replay(tmp_path / "nope.jsonl", "http://127.0.0.1:9")
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr
    assert "Traceback" not in missing.stderr
    path = tmp_path / "dead.jsonl"
    DeadLetter(path).write(records(0, 1))
    elsewhere = replay(path, "http://127.0.0.1:9", "--progress", str(tmp_path / "no" / "such"))
    assert elsewhere.returncode == 2
    assert "give --progress PATH somewhere writable" in elsewhere.stderr


def test_two_replays_of_one_file_at_once_the_second_refuses(tmp_path):

    path = tmp_path / "dead.jsonl"
    DeadLetter(path).write(records(0, 1))
    with open(str(path) + ".replayed", "ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = replay(path, "http://127.0.0.1:9")
    assert result.returncode == 2
    assert "another outbox replay is recording into" in result.stderr


def test_replay_of_a_file_that_holds_no_record_is_bad_input_and_an_empty_one_is_nothing_to_do(tmp_path):
    """helper-37: a text file that is no dead-letter file at all (its lines all "torn") replayed
    0 events, said "none left undelivered" and exited 0, as if it had done its job."""
    text = tmp_path / "notes.txt"
    text.write_text("these are my notes\nnot events\n")
    done = replay(text, "http://127.0.0.1:9")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (
        f"outbox replay: {text} holds no record of events (2 line(s), none a record): give a "
        "dead-letter file, or JSON lines of OpenLineage events"
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    done = replay(empty, "http://127.0.0.1:9")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "replayed 0 events" in done.stdout
    # helper-41: a dead-letter file whose first write was cut off (one torn line) is no bad input
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b'{"eventType": "START", "run": {"ru')
    done = replay(cut, "http://127.0.0.1:9")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 torn record(s)" in done.stderr


def test_lines_of_json_that_are_not_objects_are_counted_not_sent_and_a_rerun_has_nothing_to_do(tmp_path):
    """helper-41: a line of JSON that is no object (``[1, 2]``, ``"text"``, ``42``) was emitted,
    dropped by the outbox as ``invalid_event``, said to be "left for the next run", and exited 1:
    every rerun did the same.  It holds no event: counted beside the records that hold none, not
    sent, and the events around it are delivered once."""
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(
        b"\n".join([orjson.dumps(run_event(n=0)), b"[1, 2]", b'"text"', b"42", orjson.dumps(run_event(n=1))])
        + b"\n"
    )
    with Sink() as sink:
        first = replay(path, sink.url)
        second = replay(path, sink.url)
        arrived = [e["n"] for e in sink.events]
    assert first.returncode == 0, first.stdout + first.stderr
    assert "3 record(s) hold no JSON event" in first.stdout
    assert "invalid_event" not in first.stdout + first.stderr
    assert second.returncode == 0, second.stdout + second.stderr
    assert arrived == [0, 1]
