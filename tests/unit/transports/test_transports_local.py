"""The local transports: file (both of openlineage-python's modes), console, memory."""

import io
import json
import os

import pytest

from outbox import ConfigError, Outbox
from outbox.transports import ConsoleTransport, FileTransport, MemoryTransport

from support.helpers import run_event, wait_until


def test_file_append_writes_json_lines_in_order(tmp_path):
    path = tmp_path / "lineage.jsonl"
    with Outbox(FileTransport(path, append=True), close_at_exit=False) as outbox:
        for i in range(1000):
            outbox.emit(run_event(n=i))
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == list(range(1000))


def test_file_without_append_writes_one_file_per_event(tmp_path):
    base = tmp_path / "ol"
    with Outbox(FileTransport(base), close_at_exit=False) as outbox:
        for i in range(20):
            outbox.emit(run_event(n=i))
    files = sorted(p for p in tmp_path.iterdir() if p.name.startswith("ol-"))
    assert len(files) == 20
    assert all(p.suffix == ".json" for p in files)
    assert sorted(json.loads(p.read_text())["n"] for p in files) == list(range(20))


def test_file_that_cannot_be_written_keeps_events_and_reports(tmp_path):
    directory = tmp_path / "gone"
    directory.mkdir()
    outbox = Outbox(
        FileTransport(directory / "lineage.jsonl", append=True),
        backoff_base=0.01,
        backoff_cap=0.02,
        linger=0,
        close_at_exit=False,
    )
    directory.rmdir()  # removed under the running outbox
    outbox.emit(run_event(n=1))
    # Once the sidecar has tried (not after 0.1 s: beside load it may not have tried by then).
    assert wait_until(lambda: "cannot write" in (outbox.stats().last_error or ""), 5)
    stats = outbox.stats()
    assert stats.delivered == 0
    assert stats.in_flight == 1
    assert "cannot write" in (stats.last_error or "")
    os.mkdir(directory)  # the disk comes back
    assert outbox.flush(5)
    assert outbox.close(1).delivered == 1


@pytest.mark.parametrize("append", [True, False])
def test_a_file_path_no_event_could_be_written_to_is_a_config_error(tmp_path, append):
    with pytest.raises(
        ConfigError, match=r"log_file_path='.*missing/x.jsonl': its directory .*missing does not exist"
    ):
        FileTransport(tmp_path / "missing" / "x.jsonl", append=append)
    if append:
        with pytest.raises(
            ConfigError, match="it is a directory; point it at a file in a writable directory"
        ):
            FileTransport(tmp_path, append=True)
    else:  # (a base name: the events go to files beside it)
        assert FileTransport(tmp_path / "lineage").log_file_path == str(tmp_path / "lineage")


def test_console_prints_one_line_per_event():
    stream = io.StringIO()
    with Outbox(ConsoleTransport(stream), close_at_exit=False) as outbox:
        outbox.emit(run_event(n=1))
        outbox.emit(b'{"eventType":"COMPLETE"}')
    lines = stream.getvalue().splitlines()
    assert json.loads(lines[0])["n"] == 1
    assert json.loads(lines[1]) == {"eventType": "COMPLETE"}


def test_memory_transport_waits_for_events():
    transport = MemoryTransport()
    outbox = Outbox(transport, linger=0, close_at_exit=False)
    outbox.emit(run_event(n=7))
    assert transport.wait_for(1, timeout=5)
    assert transport.events[0]["n"] == 7
    outbox.close(1)
    assert transport.closed
