"""outbox bench: its logic on small runs, and the tool run as a user runs it, on a small scale."""

import argparse
import json
import math
import re
import subprocess
import sys

import pytest

from outbox.tools._bench_report import WIDTH, render
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


def _handler_child(stalled_off: int, stalled_on: int, calls: int = 1000) -> dict[str, object]:
    """A child's figures: ``calls`` handler calls of 200 µs (205 with lineage), of which so many
    met a stall of 20 ms."""
    return {
        "baseline_invocation_ns": [200_000] * (calls - stalled_off) + [20_000_000] * stalled_off,
        "invocation_ns": [205_000] * (calls - stalled_on) + [20_000_000] * stalled_on,
        "emit_ns": [2_000] * 2 * calls,
        "seconds": 1.0,
        "lineage_cpu_s": 0.002,
        "close_seconds": 0.1,
        "lost_reported": {},
        "peak_rss_mib": 50.0,
        "emitted": 2 * calls,
    }


def test_slow_calls_are_a_share_that_two_stalls_do_not_swing():
    """#39: the column "handler p99 ms off/on" swung from 0.4 to 18.4 ms between rows of the
    same handler (0.2 to 24 ms here, off above on in some).  Not a cold start, nor a slip in the
    arithmetic: 1 to 6% of the handler's calls meet a stall of the machine's (the scheduler, the
    four handler threads' GIL), so the p99 of one short run falls on either side of that knee.
    Two runs of one handler, 9 and 11 stalled calls in 1,000: the p99 jumps a hundredfold, the
    share of slow calls (what the column shows now) moves by 0.2 points."""
    from rich.console import Console

    few, more = (summarize("outbox-http-auto", "healthy", _handler_child(n, n), 2000) for n in (9, 11))
    assert (few.baseline_us["p99"], more.baseline_us["p99"]) == (200.0, 20_000.0)  # the swing
    assert few.slow_pct == {"off": 0.9, "on": 0.9}
    assert more.slow_pct == {"off": 1.1, "on": 1.1}
    stalling = summarize("openlineage-http", "healthy", _handler_child(10, 1000), 2000)
    assert stalling.slow_pct == {"off": 1.0, "on": 100.0}  # a client that stalls every call
    console = Console(width=WIDTH, record=True)
    render(
        [few, stalling],
        argparse.Namespace(policies=False, invocations=1000, work_us=200.0, model="sync", rate=0.0),
        console,
    )
    table = console.export_text()
    assert "slow calls" in table
    assert re.search(r"outbox-http-auto .* 0\.9/0\.9 ", table), table
    assert re.search(r"openlineage-http .* 1\.0/100\.0 ", table), table


@pytest.mark.slow
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
    assert (status, note) == ("blocked", "> 3 s")


# The comparison --quick runs (the outbox against openlineage-python's http and async_http, healthy
# and down), smaller and in two runs of about 10 s: --quick's 300 calls, and its 12 s wait for the
# contender that blocks on a dead backend, take 30 s in one.
CONTENDERS = ("outbox-http-auto", "openlineage-http", "openlineage-async_http")


def quick_comparison(
    scenario: str,
    tmp_path,
    *extra: str,
    timeout: float,
    close_timeout: float = 1,
    contenders: tuple[str, ...] = CONTENDERS,
) -> dict[str, dict]:
    out = tmp_path / "bench.json"
    result = bench_cli(
        "--scenarios", scenario, "--contenders", *contenders, "--invocations", "100",
        "--timeout", str(timeout), "--close-timeout", str(close_timeout), "--json", str(out), *extra,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "What lineage costs the handler" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 100  # fits 100 columns
    report = json.loads(out.read_text())
    assert report["settings"]["invocations"] == 100
    rows = {r["contender"]: r for r in report["results"]}
    assert set(rows) == set(contenders)
    assert {r["scenario"] for r in rows.values()} == {scenario}
    assert set(Result.__dataclass_fields__) <= set(rows[contenders[0]])
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("contender", CONTENDERS)
def test_a_healthy_backend_gets_every_event_of_every_contender_by_close(tmp_path, contender):
    # No contender blocks on a healthy backend, and close ends once all is delivered: long
    # timeouts cost nothing, and on a loaded machine the outbox's child took over 6 s to start,
    # and its close(1) delivered none of 200.  One contender per case: the three in one bench
    # took 23 s beside two busy processes (8 s idle), over the suite's 20 s for a test.
    rows = quick_comparison("healthy", tmp_path, timeout=60, close_timeout=10, contenders=(contender,))
    row = rows[contender]  # each event arrived, or is in the table as lost
    assert row["status"] in ("ok", "blocked"), (contender, row["note"])
    if row["status"] == "ok":
        assert row["delivered"] + sum(row["lost"].values()) == row["emitted"] == 200, contender
    if contender == "outbox-http-auto":
        assert row["status"] == "ok", row["note"]
        assert row["delivered"] == row["emitted"] == 200  # counted at the sink, by close
        assert row["lost"] == {}
        assert set(row["emit_us"]) == {"p50", "p90", "p99", "p99.9", "max"}
        assert 0 < row["emit_us"]["p50"] <= row["emit_us"]["p99"] <= row["emit_us"]["max"]


@pytest.mark.slow
def test_a_dead_backend_loses_nothing_the_outbox_does_not_count_and_is_drawn(tmp_path):
    picture = tmp_path / "bench.png"
    # Beside other work the outbox's child took over 6 s, then over 12 s: a timeout of 20 s,
    # which openlineage-http, blocking on a dead backend, would use whole (its own test below).
    rows = quick_comparison(
        "down", tmp_path, "--plot", str(picture), timeout=20,
        contenders=("outbox-http-auto", "openlineage-async_http"),
    )  # fmt: skip
    outbox = rows["outbox-http-auto"]
    assert outbox["status"] == "ok"
    assert outbox["delivered"] == 0
    assert outbox["lost"] == {"dropped_shutdown": 200}  # counted, by name
    if rows["openlineage-async_http"]["status"] == "ok":
        assert rows["openlineage-async_http"]["lost"] == {"not_delivered": 200}  # lost, silently
    assert picture.stat().st_size > 10_000


@pytest.mark.slow
def test_openlineage_http_blocks_on_a_dead_backend_and_is_shown_blocked(tmp_path):
    # It retries for longer than any timeout a test would wait: shown blocked (killed by the
    # bench at --timeout), or ok had it given up in time.
    rows = quick_comparison("down", tmp_path, timeout=6, contenders=("openlineage-http",))
    assert rows["openlineage-http"]["status"] in ("blocked", "ok")
    assert rows["openlineage-http"]["delivered"] == 0


def bench_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_"))}
    return subprocess.run(
        [sys.executable, "-m", "outbox.tools.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**clean, **(env or {})},
    )


@pytest.mark.slow
@pytest.mark.parametrize("size", [50, 2000])
def test_policies_compares_each_policy_and_buffer_size_under_overload(tmp_path, size):
    # 100 events at 500 calls/s overflow 50 and fit in 2,000; three contenders per size (a test
    # each, under 20 s), each a process with a close deadline, a second of quiet between them.
    out = tmp_path / "policies.json"
    result = bench_cli(
        "--policies", "--buffer-sizes", str(size), "--invocations", "50", "--rate", "500",
        "--latency", "0.2", "--close-timeout", "0.3", "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 100
    rows = {r["contender"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {f"{p} {size}" for p in ("drop_oldest", "drop_newest", "block")}
    for row in rows.values():
        assert row["status"] == "ok"
        assert row["scenario"] == "overload"
        # Each event counted once, by the outbox's report: delivered or dropped under a named
        # reason, adding up to what was sent. The sink's count is beside it, and may be more:
        # requests cut off at close's deadline arrive unacknowledged (at least once).
        assert row["delivered"] == row["reported_delivered"]
        assert row["delivered"] + sum(row["lost"].values()) == row["emitted"] == 100
        assert row["received"] >= row["delivered"]
        assert "not_delivered" not in row["lost"]
    # The table says the same: each row's delivered and dropped add up to the 100 events sent.
    assert "delivered + dropped = the 100 events sent" in " ".join(result.stdout.split())
    for contender, row in rows.items():
        policy, held = contender.split()
        cells = policy_row(result.stdout, policy, f"{int(held):,}")
        dropped = sum(int(n.replace(",", "")) for n in re.findall(r"[a-z_]+ ([\d,]+)", cells["dropped"]))
        assert int(cells["delivered"].replace(",", "")) == row["delivered"]
        assert int(cells["delivered"].replace(",", "")) + dropped == 100
        assert int(cells["sink"].replace(",", "")) == row["received"]
        assert "unaccounted" not in cells["dropped"]
    # A small buffer under overload drops (both drop policies count it as dropped_full); a big one
    # holds the burst, and loses only what is still queued at close.
    if size == 50:
        assert rows["drop_oldest 50"]["lost"].get("dropped_full", 0) > 0
        assert rows["drop_newest 50"]["lost"].get("dropped_full", 0) > 0
        # block makes the handler wait for room: its tail is the block timeout's, the others' not.
        block, newest = rows["block 50"]["invocation_us"], rows["drop_newest 50"]["invocation_us"]
        assert block["p99"] > 50_000 > newest["p50"]
    else:
        assert set(rows["drop_oldest 2000"]["lost"]) <= {"dropped_shutdown"}
    for policy in ("drop_oldest", "drop_newest", "block"):
        assert policy in result.stdout


def policy_row(table: str, policy: str, size: str) -> dict[str, str]:
    """The cells of one row of --policies' table, its dropped reasons joined across the lines
    they wrap onto."""
    lines = table.splitlines()
    start = next(i for i, text in enumerate(lines) if text.split()[:2] == [policy, size])
    cells = lines[start].split()
    dropped = " ".join(cells[4:-2])
    for text in lines[start + 1 :]:
        parts = text.split()
        if not parts or parts[0] in ("drop_oldest", "drop_newest", "block") or not text.startswith(" " * 20):
            break
        dropped += " " + " ".join(parts)
    return {"delivered": cells[3], "dropped": dropped, "sink": cells[-2]}


@pytest.mark.slow
def test_from_env_runs_the_environments_own_configuration_as_a_contender(tmp_path):
    out = tmp_path / "from-env.json"
    with Sink() as real:
        env = {"OPENLINEAGE_URL": real.url, "OUTBOX_MAX_EVENTS": "3", "OUTBOX_POLICY": "drop_newest"}
        result = bench_cli(
            "--from-env", "--scenarios", "healthy", "real", "--contenders", "outbox-http-auto",
            "--invocations", "200", "--json", str(out), env=env,
        )  # fmt: skip
        arrived_at_real = len(real.events)
    assert result.returncode == 0, result.stderr
    rows = {(r["contender"], r["scenario"]): r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {("outbox-http-auto", "healthy"), ("from-env", "healthy"), ("from-env", "real")}
    # The environment's OUTBOX_* settings are in force: a 3-event buffer under drop_newest drops.
    assert rows["from-env", "healthy"]["lost"].get("dropped_full", 0) > 0
    assert not rows["outbox-http-auto", "healthy"]["lost"]
    # The real scenario went to the configured backend, and its delivered count is the outbox's.
    assert arrived_at_real == rows["from-env", "real"]["delivered"] > 0
    assert "delivered as the outbox reports it" in rows["from-env", "real"]["note"]


def test_the_scenario_real_needs_from_env():
    result = bench_cli("--scenarios", "real")
    assert result.returncode == 2
    assert "add --from-env" in result.stderr


def test_every_option_of_every_command_has_help():
    import argparse

    from outbox.tools.bench import build_parser as bench_parser
    from outbox.tools.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    listed = {choice.dest for choice in commands._choices_actions}
    assert listed == {"check", "demo", "sink", "forward", "replay", "bench"}  # all in outbox --help
    parsers = [parser, bench_parser(), *(p for name, p in commands.choices.items() if name != "bench")]
    for each in parsers:
        for action in each._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, f"{each.prog} {action.option_strings or action.dest} has no help text"
        assert "``" not in each.format_help()


def test_version():
    from outbox import __version__

    result = subprocess.run(
        [sys.executable, "-m", "outbox.tools.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"outbox (lineage-outbox) {__version__}"
