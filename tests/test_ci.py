""".ci/run, played through with stand-ins: the README's test command is what it runs (and times
in its log), the slow tests once on 3.11, the end-to-end suite beside the other Pythons; and a
clone without the Marquez peer stops at once, saying what to set.

Every Python is a stand-in on PATH that records its arguments (and makes a virtual environment
of stand-ins): what is tested is .ci/run's own order and commands, not the suites."""

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).parent.parent

PYTHON = """#!/bin/bash
# A Python that records its arguments; -m venv makes a folder of such tools.
echo "$(basename "$0") $*" >> "$CI_LOG"
case "$1" in
  --version) echo "Python {version}" ;;
  -m) if [ "$2" = venv ]; then
        mkdir -p "$3/bin"
        for tool in python pip ruff mypy; do
          printf '#!/bin/bash\\necho "%s $*" >> "$CI_LOG"\\n' "$3/bin/$tool" > "$3/bin/$tool"
          chmod +x "$3/bin/$tool"
        done
      fi ;;
esac
"""


def clone(tmp_path: Path) -> Path:
    """What .ci/run reads of a checkout: itself, the README and docs/."""
    checkout = tmp_path / "lineage-outbox"
    (checkout / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", checkout / ".ci" / "run")
    shutil.copy(ROOT / "README.md", checkout / "README.md")
    shutil.copytree(ROOT / "docs", checkout / "docs")
    return checkout


def run_ci(tmp_path: Path, **variables: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    for name, version in (("python3", "3.11.9"), ("python3.12", "3.12.9"), ("python3.13", "3.13.9")):
        (stand_ins / name).write_text(PYTHON.format(version=version))
        (stand_ins / name).chmod(0o755)
    log = tmp_path / "calls.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MARQUEZ_", "KAFKA_", "OUTBOX_", "CI"))}
    env |= {
        "PATH": f"{stand_ins}{os.pathsep}{env['PATH']}",
        "CI_LOG": str(log),
        "LINEAGE_OUTBOX_PEERS_CACHE": str(tmp_path / "cache"),
        **variables,
    }
    checkout = clone(tmp_path)
    done = subprocess.run(
        ["bash", ".ci/run"], cwd=checkout, env=env, capture_output=True, text=True, timeout=120
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return done, calls


def test_ci_runs_and_times_the_readmes_test_command_then_the_slow_tests(tmp_path):
    peer = tmp_path / "peers" / "marquez"
    peer.mkdir(parents=True)
    (peer / "start.sh").write_text("exit 0\n")
    done, calls = run_ci(tmp_path, MARQUEZ_PEER_DIR=str(peer))
    assert done.returncode == 0, done.stdout + done.stderr
    readme = re.search(r"<!-- test-command -->\n```sh\n(.*)\n```", (ROOT / "README.md").read_text())
    assert readme
    installs, pytest = readme[1].rsplit(" && ", 1)
    assert installs == "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'"
    assert pytest == '.venv/bin/python -m pytest -q -n 4 -m "not slow"'
    durations = "--durations=8 --durations-min=10"
    # In order, on 3.11: the README's install steps, ruff, mypy, its pytest command as written
    # (the log's slowest tests added), then the slow tests in the same workers.
    on_311 = [call for call in calls if call.startswith((".venv/", "python3 ")) and "--version" not in call]
    assert on_311[:2] == ["python3 -m venv .venv", ".venv/bin/pip install -q -e .[test]"]
    assert on_311[2:6] == [
        ".venv/bin/ruff check .",
        ".venv/bin/ruff format --check .",
        ".venv/bin/mypy ",
        f".venv/bin/python -m pytest -q -n 4 -m not slow {durations}",
    ]
    assert on_311[6] == f".venv/bin/python -m pytest -q -n 4 -m slow --dist loadgroup {durations}"
    assert ".venv/bin/python -m pytest -m e2e tests/e2e -q" in calls  # beside the others
    for version in ("3.12", "3.13"):
        runs = [call for call in calls if call.startswith(f".venv-{version}/bin/python -m pytest")]
        assert runs == [
            f".venv-{version}/bin/python -m pytest -q -n 4 -m not slow -n 3 --dist loadgroup {durations}"
        ]
    assert not any(" -m slow" in call for call in calls if call.startswith(".venv-"))
    # The log says how long the README's command took, its install and its pytest apart.
    assert re.search(
        r"^== the README's test command as written: \dm\d\ds \(its install \dm\d\ds, its pytest \dm\d\ds\)",
        done.stdout,
        re.M,
    ), done.stdout
    assert "== .ci/run passed in" in done.stdout


def test_ci_stops_at_once_without_the_marquez_peer_saying_what_to_set(tmp_path):
    # No ../shared beside this clone, and neither MARQUEZ_PEER_DIR nor MARQUEZ_URL.
    done, calls = run_ci(tmp_path)
    assert done.returncode == 1
    assert calls == []  # nothing installed, nothing run
    assert done.stdout == ""
    said = done.stderr.strip()
    assert said.startswith(".ci/run: the end-to-end suite needs Marquez, and there are no peer scripts at ")
    assert "set MARQUEZ_PEER_DIR to the folder of shared/peers/marquez" in said
    assert "or MARQUEZ_URL to a running Marquez" in said
    assert len(said.splitlines()) == 1


def test_ci_names_no_folder_of_this_machine():
    script = (ROOT / ".ci" / "run").read_text()
    assert not re.findall(r"(?<![\w.])/(?:work|root|home|tmp|opt)/", script)
