"""``python -m outbox.tools.benchmarks`` runs: each section's measure on a small scale, with what it
counts checked (no timing is asserted: this machine is shared)."""

import os

import httpx
import pytest

from outbox.tools.benchmarks import throughput
from outbox.tools.benchmarks.__main__ import SECTIONS, main

# Each section measured on a small scale: once per CI run, on 3.11 (docs/development.md).
pytestmark = pytest.mark.slow


def test_every_section_has_a_command_line_name():
    assert set(SECTIONS) == {"lanes", "healthy", "cpu", "tail", "kafka", "spill"}


def test_the_does_no_work_server_answers_and_counts():
    with throughput.Server(*throughput.NULL_SERVER) as url:
        assert httpx.post(f"{url}/api/v1/lineage", content=b"[1,2]").status_code == 200
        assert httpx.get(f"{url}/count").json() == {"requests": 1, "bytes": 5}


def test_the_does_no_work_server_keeps_each_body_with_its_time_and_sender():
    """``--keep``, for the forward benchmark: which events arrived, how often, from whom; and
    a sender held: its request taken, kept and counted, never answered."""
    from outbox.tools.benchmarks.forward import NullServer

    with NullServer() as server:
        batch = b'[{"eventTime": "t", "n": 1}, {"eventTime": "t", "n": 2}]'
        for body, who in ((batch, "forwarder-0"), (b'{"eventTime": "t", "n": 1}', "forwarder-1")):
            answer = httpx.post(
                f"{server.url}/api/v1/lineage/batch", content=body, headers={"Authorization": f"Bearer {who}"}
            )
            assert answer.status_code == 200
        counts = server.count()
        assert (counts["requests"], counts["events"]) == (2, 3)
        assert counts["by"] == {"forwarder-0": 2, "forwarder-1": 1}
        assert 0 < counts["first"] <= counts["last"]
        arrivals = server.arrivals()
    assert [(who, n) for _, who, n in arrivals] == [
        ("forwarder-0", 1),
        ("forwarder-0", 2),
        ("forwarder-1", 1),
    ]
    assert arrivals[0][0] == counts["first"]
    assert arrivals[-1][0] == counts["last"]


def test_the_forward_benchmark_fails_a_run_that_lost_copied_too_much_or_killed_too_late():
    from outbox.tools.benchmarks.forward import Run, check

    killed = {"killed_partitions": [0, 2], "left_at_kill": 500, "uncommitted_at_kill": 40}
    assert check(Run(2, 1000, **killed, copies_of_uncommitted=40, duplicates=40, bound=1040)) == []
    assert check(Run(2, 1000, lost=1)) == ["1 event(s) lost"]
    assert check(Run(2, 1000, duplicates=5)) == []  # no kill: a rebalance's copies are allowed
    over = check(Run(2, 1000, **killed, copies_of_uncommitted=41, duplicates=41, bound=1040))
    assert over == ["41 copies of the killed forwarder's 40 uncommitted records"]
    over = check(Run(2, 1000, **killed, copies_of_uncommitted=40, duplicates=1041, bound=1040))
    assert over == ["1041 duplicates, over the bound of 1040"]
    late = check(Run(2, 1000, **{**killed, "left_at_kill": 0}, bound=1040))
    assert len(late) == 1
    assert late[0].startswith("the forwarder was killed once its share was done, not mid-stream")


def test_healthy_delivers_every_event_with_and_without_lanes():
    for server in (throughput.NULL_SERVER, throughput.SINK):
        for k in (1, 8):
            row = throughput.bench_healthy(server, 500, k)
            assert row["delivered"] == row["events"] == 1000
            assert row["per_s"] > 0


def test_cpu_counts_every_delivered_event_against_a_floor():
    row = throughput.bench_cpu(500)
    assert row["delivered"] == 1000
    assert row["floor_us"] > 0
    assert row["per_event_us"] > 0


def test_tail_measures_every_invocation_and_loses_nothing():
    row = throughput.bench_tail(2000, 0.3)
    assert row["invocations"] >= 250
    assert row["lost"] == {}
    assert 0 < row["p50_us"] <= row["p99_us"] <= row["p999_us"]


def test_spill_writes_every_event_and_measures_its_size():
    from outbox.tools.benchmarks.spill import bench_spill

    row = bench_spill(300)
    assert row["written"] == row["events"] == 600
    assert row["per_s"] > 0
    # A record is the event's JSON plus its frame, run id and key: more, but not twice more.
    assert row["json_bytes_per_event"] < row["disk_bytes_per_event"] < 2 * row["json_bytes_per_event"]


@pytest.mark.parametrize(
    ("case", "events"),
    [("object", 7), ("dict", 7), ("bytes", 7), ("helpers", 14), ("helpers-span", 14), ("span-only", 0)],
)
def test_each_instructions_case_makes_its_calls(case, events):
    # What callgrind counts (valgrind is not needed to run the child): 7 calls of the case,
    # after the warm-up's three events (the span cases' 5,000 runs before emit nothing).
    import subprocess
    import sys

    from outbox.tools.benchmarks.instructions import CHILD

    out = subprocess.run([sys.executable, str(CHILD), case, "7"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["accepted", str(3 + events)]


def test_kafka_against_raw_aiokafka_delivers_the_same_records():
    row = throughput.bench_kafka_vs_raw(400)
    assert row["delivered"] == row["events"] == 400
    assert row["raw_per_s"] > 0
    assert row["outbox_per_s"] > 0


def test_only_one_section_from_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(SECTIONS, "cpu", lambda: throughput.bench_cpu(200))
    out = tmp_path / "figures.json"
    assert main(["--only", "cpu", "--json", str(out)]) == 0
    assert '"delivered": 400' in out.read_text()


def test_tail_sets_a_minimal_python_emit_beside_the_outbox_and_judges_only_the_outbox(tmp_path):
    import json
    import subprocess
    import sys

    figures = tmp_path / "tail.json"
    command = [sys.executable, "-m", "outbox.tools.benchmarks", "tail", "--invocations", "60"]
    command += ["--threads", "1", "--kinds", "objects", "helpers", "--scenarios", "http-down"]
    command += ["--rows", "lineage", "full"]
    out = subprocess.run([*command, "--json", str(figures)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "python floor" in out.stdout
    rows = json.loads(figures.read_text())["rows"]
    assert set(rows) == {
        "1/objects/off",
        "1/objects/floor",
        "1/objects/idle",
        "1/objects/http-down",
        "1/helpers/off",
        "1/helpers/idle",
        "1/helpers/http-down",
        "1/objects/full-drop_oldest",
        "1/objects/full-drop_newest",
        "1/objects/full-block",
    }
    assert rows["1/objects/floor"]["delivered"] is None  # no outbox in that row
    down = rows["1/objects/http-down"]  # 70 invocations (10 of warm-up), two events each: all counted
    assert down["delivered"] == 0
    assert sum(down["lost"].values()) == 140
    # Every target is a ratio to a figure of the same run: the floor, two emits, an empty buffer.
    lines = out.stdout.splitlines()
    verdict = next(line for line in lines if "target every emit row p99 <= 2x the floor's" in line)
    assert "/floor" not in verdict  # the worst row named is an outbox row, never the floor
    assert any("target run helpers p50 <= 1.5x the two emits of objects'" in line for line in lines)
    assert any("target run helpers p99.9 <= 4x the floor's" in line for line in lines)
    full = rows["1/objects/full-drop_oldest"]
    assert full["held"] >= 9_000  # the buffer was full (of 10,000) when the full phase began
    assert any("target 1/objects/full-drop_newest p50 and p99 <= 1.5x" in line for line in lines)


def test_tail_times_the_whole_invocation_and_counts_what_a_busy_handler_loses(tmp_path):
    import json
    import subprocess
    import sys

    figures = tmp_path / "tail.json"
    command = [sys.executable, "-m", "outbox.tools.benchmarks", "tail", "--rows", "whole", "busy"]
    command += ["--whole", "50:2000", "--whole-invocations", "200", "--busy", "50"]
    command += ["--busy-invocations", "300", "--scenarios", "http-healthy"]
    out = subprocess.run([*command, "--json", str(figures)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(figures.read_text())["rows"]
    assert set(rows) == {"1/helpers/whole-off-50-2000", "1/helpers/whole-on-50-2000", "1/helpers/busy-50"}
    # The whole invocation holds the handler's 50 µs of computing, lineage on or off.
    assert rows["1/helpers/whole-off-50-2000"]["p50"] >= 50
    assert rows["1/helpers/whole-on-50-2000"]["p50"] >= 50
    assert rows["1/helpers/whole-off-50-2000"]["delivered"] is None
    # Of each sample, the wait to start once due (the GIL held elsewhere): a part of it.
    for key in ("1/helpers/whole-off-50-2000", "1/helpers/whole-on-50-2000"):
        waited = rows[key]["waited"]
        assert 0 <= waited["p99"] <= waited["p99.9"] <= rows[key]["max"], rows[key]
    assert out.stdout.count("of which waiting to start, once due: p99") == 2
    busy = rows["1/helpers/busy-50"]
    assert busy["delivered"] + busy["dropped"][0] == 602  # every event counted (2 of warm-up)
    assert "whole invocation at 4,000 events/s, p99.9 <= 1.5x lineage off + 20 µs" in out.stdout
    assert "target 1/helpers/busy-50: a busy handler against a healthy sink loses nothing" in out.stdout


def test_the_busy_rows_run_under_the_ordinary_scheduler_even_with_realtime():
    # Under SCHED_FIFO a handler that computes without pause keeps its CPU from its own sidecar
    # (no time slices at one priority): the busy rows, and the sink they start, run under the
    # ordinary scheduler; the parent is put back under SCHED_FIFO after them.  (In a process of
    # its own: this one's scheduling is left alone.  Needs root or CAP_SYS_NICE, as --realtime.)
    import subprocess
    import sys

    child = (
        "import os, subprocess, sys\n"
        "from outbox.tools.benchmarks.tail import ordinary_scheduling\n"
        "os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))\n"
        "with ordinary_scheduling():\n"
        "    inside = os.sched_getscheduler(0)\n"
        "    probe = 'import os; print(os.sched_getscheduler(0))'\n"
        "    started = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True)\n"
        "print(inside, started.stdout.strip(), os.sched_getscheduler(0))\n"
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    inside, started, after = map(int, out.stdout.split())
    assert (inside, started, after) == (os.SCHED_OTHER, os.SCHED_OTHER, os.SCHED_FIFO)


def test_the_minimal_emitter_keeps_its_bound_and_refuses_what_is_no_event():
    from outbox.tools.benchmarks._tail_child import MinimalEmitter

    emitter = MinimalEmitter({dict}, room=2)
    assert all(emitter.emit({"n": n}) for n in range(3))
    assert list(emitter.queue) == [{"n": 1}, {"n": 2}]  # the oldest went
    with pytest.raises(TypeError, match="not an event: str"):
        emitter.emit("x")


def test_tail_refuses_more_invocations_than_its_full_rows_fit_with_a_clear_error(capsys):
    from outbox.tools.benchmarks import tail

    with pytest.raises(SystemExit) as exit_:
        tail.main(["--rows", "full", "--invocations", str(tail.FULL_INVOCATIONS_MOST + 1)])
    assert exit_.value.code == 2
    assert (
        f"--invocations {tail.FULL_INVOCATIONS_MOST + 1}: the full rows take at most"
        in capsys.readouterr().err
    )
