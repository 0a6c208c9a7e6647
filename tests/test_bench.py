"""outbox bench: its logic on small runs, and one --quick run."""

import json
import math
import subprocess
import sys

import pytest

from outbox.tools.bench import Result, percentile, run_child, summarize
from outbox.tools.faultproxy import FaultProxy
from outbox.tools.sink import Sink


@pytest.mark.parametrize(
    ("samples", "p", "expected"),
    [
        ([], 50, math.nan),
        ([5], 99, 5),
        ([1, 2, 3, 4], 50, 2),
        ([1, 2, 3, 4], 75, 3),
        (list(range(1, 101)), 99, 99),
        (list(range(1, 1001)), 99.9, 999),
        ([3, 1, 2], 100, 3),
    ],
)
def test_percentile(samples, p, expected):
    value = percentile(samples, p)
    assert (math.isnan(value) and math.isnan(expected)) or value == expected


def test_summarize_reports_overhead_losses_and_cost():
    child = {
        "baseline_invocation_ns": [100_000] * 10,
        "invocation_ns": [110_000] * 10,
        "emit_ns": [2_000] * 20,
        "seconds": 0.5,
        "lineage_cpu_s": 0.002,
        "close_seconds": 0.1,
        "lost_reported": {"dropped_shutdown": 4},
        "peak_rss_mib": 50.0,
        "emitted": 20,
    }
    result = summarize("outbox-http-auto", "slow", child, delivered=16)
    assert result.status == "ok"
    assert result.emit_us["p50"] == 2.0
    assert result.overhead_us == 10.0
    assert result.lost == {"dropped_shutdown": 4}
    assert result.cpu_us_per_delivered == 125.0
    assert result.throughput_per_s == 20.0
    silent = summarize("openlineage-async_http", "down", {**child, "lost_reported": {}}, delivered=5)
    assert silent.lost == {"not_delivered": 15}  # what never arrived is named, not hidden


def test_a_contender_that_blocks_is_reported_not_waited_for():
    with Sink() as sink, FaultProxy("127.0.0.1", sink.port, mode="blackhole") as proxy:
        spec = {
            "contender": "openlineage-http",
            "url": proxy.url,
            "invocations": 20,
            "work_us": 10,
            "model": "sync",
            "rate": 0,
            "close_timeout": 1,
        }
        status, note = run_child(spec, timeout=3)
    assert (status, note) == ("blocked", "blocked longer than 3 s")


def test_quick_run(tmp_path):
    out = tmp_path / "bench.json"
    picture = tmp_path / "bench.png"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "outbox.tools.cli",
            "bench",
            "--quick",
            "--json",
            str(out),
            "--plot",
            str(picture),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["settings"]["quick"] is True
    rows = {(r["contender"], r["scenario"]): r for r in report["results"]}
    assert set(rows) == {
        (c, s)
        for c in ("outbox-http-auto", "openlineage-http", "openlineage-async_http")
        for s in ("healthy", "down")
    }
    assert set(Result.__dataclass_fields__) <= set(rows["outbox-http-auto", "healthy"])
    healthy = rows["outbox-http-auto", "healthy"]
    assert healthy["status"] == "ok"
    assert healthy["delivered"] == healthy["emitted"] == 600  # every event, by close
    assert set(healthy["emit_us"]) == {"p50", "p90", "p99", "p99.9", "max"}
    down = rows["outbox-http-auto", "down"]
    assert down["status"] == "ok"
    assert down["delivered"] == 0
    assert down["lost"] == {"dropped_shutdown": 600}  # counted, by name
    assert rows["openlineage-http", "down"]["status"] in ("blocked", "ok")
    assert "lineage cost per handler" in result.stdout
    assert picture.stat().st_size > 10_000
