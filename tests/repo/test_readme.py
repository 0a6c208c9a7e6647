"""The examples of the README and of docs/ run, and their commands exist."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import REPO

ROOT = REPO
# The README, then docs/: a marker is looked for in all of them.
README = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def block_after(marker: str) -> str:
    match = re.search(re.escape(f"<!-- {marker} -->") + r"\n```\w*\n(.*?)```", README, re.S)
    assert match, f"no block after <!-- {marker} --> in README.md or docs/"
    return match.group(1)


def run_python(code: str, cwd: Path, path: Path | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(path)} if path is not None else None
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_quickstart_example(tmp_path):
    out = run_python(block_after("example: quickstart"), tmp_path)
    assert out.strip() == "2"
    lines = (tmp_path / "lineage.jsonl").read_text().splitlines()
    assert [json.loads(line)["eventType"] for line in lines] == ["START", "COMPLETE"]


def test_front_page_example(tmp_path):
    # The README's handler, as the platform calls it: in a span, one object that works and one
    # whose work raises; the events go to a file transport configured by the environment.
    code = block_after("example: front").replace("...  # the function's own work", "work(event)")
    program = (
        "import os, types\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "def work(event):\n"
        "    if event.object_key.endswith('.bad'):\n"
        "        raise ValueError('cannot process ' + event.object_key)\n"
        + code
        + "\nspans = trace.get_tracer('platform')\n"
        "for key in ('orders.csv', 'orders.bad'):\n"
        "    with spans.start_as_current_span('lineagefn') as span:\n"
        "        print(f'{span.get_span_context().trace_id:032x}')\n"
        "        try:\n"
        "            handler(None, types.SimpleNamespace(bucket='docs-src', object_key=key))\n"
        "        except ValueError:\n"
        "            pass\n"
        "print(outbox.close(5).delivered)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_"))}
    env |= {"OPENLINEAGE__TRANSPORT__TYPE": "file", "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": "runs.jsonl"}
    env["OPENLINEAGE__TRANSPORT__APPEND"] = "true"
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    first_trace, second_trace, delivered = result.stdout.split()
    assert delivered == "4"
    events = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [e["eventType"] for e in events] == ["START", "COMPLETE", "START", "FAIL"]
    assert [e["run"]["runId"].replace("-", "") for e in events] == [first_trace] * 2 + [second_trace] * 2
    assert events[3]["run"]["facets"]["errorMessage"]["message"] == "cannot process orders.bad"
    assert {(e["inputs"][0]["namespace"], e["inputs"][0]["name"]) for e in events} == {
        ("s3://docs-src", "orders.csv"),
        ("s3://docs-src", "orders.bad"),
    }


def test_from_env_example(tmp_path):
    program = block_after("example: from-env")  # (as it stands: it runs on its own)
    program += "print(report.delivered, outbox.stats().delivered)\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_"))}
    env |= {"OPENLINEAGE__TRANSPORT__TYPE": "file", "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": "out.jsonl"}
    env |= {"OPENLINEAGE__TRANSPORT__APPEND": "true", "OUTBOX_MAX_EVENTS": "100"}
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "1"]
    assert json.loads((tmp_path / "out.jsonl").read_text())["eventType"] == "START"


def test_the_install_commands_build_a_wheel_that_installs_and_imports(tmp_path):
    """The README's install block, as a user runs it from their project's folder: the wheel it
    builds is the one it names, and holds the typed package.  (Built from a copy of the
    checkout, so that parallel runs do not share its build folder; without build isolation and
    dependencies, so that no registry is needed.)"""
    lines = [line.split("#")[0].strip() for line in block_after("install-commands").splitlines()]
    from_checkout, build, install = lines
    assert from_checkout == "pip install /path/to/lineage-outbox"
    wheel = install.removeprefix("pip install ")
    checkout = tmp_path / "lineage-outbox"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (checkout / name).write_bytes((ROOT / name).read_bytes())
    shutil.copytree(ROOT / "outbox", checkout / "outbox", ignore=shutil.ignore_patterns("__pycache__"))
    project = tmp_path / "project"
    project.mkdir()
    command = build.replace("/path/to/lineage-outbox", str(checkout)).replace("python3", sys.executable)
    done = subprocess.run(
        [*command.split(), "--no-build-isolation", "-q"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p.name for p in (project / "dist").iterdir()] == [Path(wheel).name]
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found = run_python("import outbox, pathlib; print(pathlib.Path(outbox.__file__).parent)", tmp_path, site)
    assert found.strip() == str(site / "outbox")
    assert (site / "outbox" / "py.typed").exists()
    assert (site / "outbox" / "transports" / "http.py").exists()


def test_the_first_screen_says_what_dataengine_is_and_how_to_install():
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:45])
    said = first_screen.index("DataEngine")
    assert first_screen[said:].startswith("DataEngine, the function service of VAST Cluster")
    assert "<!-- install-commands -->" in first_screen
    assert "A loss is never silent" in first_screen


def test_the_readme_front_page_fits_two_screens():
    # What it is, why, the two commands, an example, where to read next: no more.
    assert len((ROOT / "README.md").read_text().splitlines()) <= 100


def test_the_benchmarks_page_is_current_figures_a_reader_reads_once():
    # #38: the figures of now, each with its command, in at most about 400 lines; no diary (a
    # dated entry, an issue's item), no path of a developer's machine.
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert len(text.splitlines()) <= 400
    assert not re.search(r"/(?:work|home|root|Users)/|\b20\d\d-\d\d-\d\d\b|#\d+ item", text)


def test_custom_transport_example(tmp_path):
    out = run_python(block_after("example: custom-transport"), tmp_path)
    assert re.fullmatch(r"run:ns/j \d+ bytes\n", out)


@pytest.mark.parametrize(
    "marker",
    [
        "demo-command",
        "test-command",
        "bench-command",
        "sink-command",
        "forward-command",
        "forward-bench-command",
        "e2e-command",
        "quick-bench-command",
        "check-command",
        "policies-command",
    ],
)
def test_commands_are_documented(marker):
    assert block_after(marker).strip()


def run_demo(tmp_path, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_", "VASTPIPELINE"))
    }
    return subprocess.run(
        [sys.executable, "-m", "function"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO), **variables},
    )


def test_the_demo_runs(tmp_path):
    result = run_demo(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the sink received 4 events" in result.stdout
    assert "all as expected" in result.stdout
    # The function's own log, and no library's INFO (httpx logs every request at INFO).
    output = result.stdout + result.stderr
    assert "[lineagefn] processing" in output
    assert "[httpx]" not in output
    assert "HTTP Request" not in output


def test_the_demo_against_an_unreachable_backend_says_the_loss_is_expected(tmp_path):
    from support.helpers import refused_port

    url = f"http://127.0.0.1:{refused_port()}"
    result = run_demo(tmp_path, OPENLINEAGE_URL=url, OUTBOX_SHUTDOWN_TIMEOUT="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "UNEXPECTED" not in result.stdout
    assert f"expected: the backend (HttpTransport('{url}', mode='auto')) took none of the 4 events" in (
        result.stdout
    )
    assert "all as expected" in result.stdout


def test_the_demo_against_a_backend_that_refuses_the_credentials_fails(tmp_path):
    # A backend that answered 403 to every event is a configuration to fix, not the outage the
    # demo rides out: "all as expected" and exit 0 told a user checking their backend it worked.
    from outbox.tools.sink import Sink, SinkBehaviour

    with Sink(behaviour=SinkBehaviour(api_key="right")) as sink:
        result = run_demo(
            tmp_path, OPENLINEAGE_URL=sink.url, OPENLINEAGE_API_KEY="wrong", OUTBOX_SHUTDOWN_TIMEOUT="1"
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "UNEXPECTED: the backend answered and took none of the events" in result.stdout
    assert "answered 403 Forbidden" in result.stdout
    assert "all as expected" not in result.stdout


def test_run_helpers_example(tmp_path):
    out = run_python(block_after("example: run-helpers"), tmp_path)
    assert out.strip() == "all delivered"
    events = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [e["eventType"] for e in events] == ["START", "COMPLETE", "START", "FAIL"]
    assert events[3]["run"]["facets"]["errorMessage"]["message"] == "cannot process lineage-src/orders.bad"


def test_outbox_demo_command_runs(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "outbox.tools.cli",
            "demo",
            "--runs",
            "3",
            "--file",
            str(tmp_path / "d.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "delivered 6, lost none" in result.stdout
    assert len((tmp_path / "d.jsonl").read_text().splitlines()) == 6
