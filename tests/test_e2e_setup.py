"""The end-to-end suite's set-up says what it waits for before each long step (resolving jars
with Maven, formatting and starting Kafka, building and starting Marquez, stopping them), and
says it past pytest's capture.

Maven, the JVM and the Marquez scripts are played by small stand-ins on PATH: what is tested is
the harness's own output and order, not the peers (the e2e suite runs the real ones)."""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from e2e import peers

FAKE_MVN = """#!/bin/sh
for arg in "$@"; do
  case "$arg" in -DoutputDirectory=*) dir="${arg#-DoutputDirectory=}";; esac
done
mkdir -p "$dir" && touch "$dir/kafka.jar"
"""

FAKE_JAVA = """#!{python}
import re, signal, socket, sys, time, uuid
args = sys.argv[1:]
if "kafka.tools.StorageTool" in args:
    print(uuid.uuid4()) if "random-uuid" in args else None
    sys.exit(0)
properties = open(args[-1]).read()
port = int(re.search(r"^listeners=PLAINTEXT://127.0.0.1:(\\d+)", properties, re.M).group(1))
server = socket.create_server(("127.0.0.1", port))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(1)
"""


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """mvn and java stand-ins first on PATH, and an empty cache for the peers' jars."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("mvn", FAKE_MVN), ("java", FAKE_JAVA.format(python=sys.executable))):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(peers, "CACHE", tmp_path / "cache")
    return bin_dir


def test_kafka_says_each_long_step_before_it_begins(tools):
    said: list[str] = []
    kafka = peers.ApacheKafka(said.append)
    assert [line.split(" ", 1)[0] for line in said] == ["resolving"]  # before Maven ran
    assert "org.apache.kafka:kafka_2.13" in said[0]
    assert "Maven Central" in said[0]
    try:
        kafka.start(timeout=30)
        assert [line.split(" ", 1)[0] for line in said] == ["resolving", "formatting", "starting"]
        assert f"waiting up to 30 s for it to listen on {kafka.bootstrap_servers}" in said[-1]
    finally:
        kafka.remove()
    assert said[-1].startswith(f"stopping Apache Kafka on {kafka.bootstrap_servers}")
    # Jars already resolved: that step is not long any more, and says nothing.
    said.clear()
    again = peers.ApacheKafka(said.append)
    assert said == []
    again.remove()


START_SH = """#!/bin/sh
mkdir -p "$MARQUEZ_RUN_DIR/www/api/v1"
echo '{"namespaces": []}' > "$MARQUEZ_RUN_DIR/www/api/v1/namespaces"
nohup {python} -m http.server "$MARQUEZ_PORT" --bind 127.0.0.1 --directory "$MARQUEZ_RUN_DIR/www" \\
  > "$MARQUEZ_RUN_DIR/marquez.log" 2>&1 &
echo $! > "$MARQUEZ_RUN_DIR/marquez.pid"
printf 'MARQUEZ_URL=http://127.0.0.1:%s\\nMARQUEZ_PG_PORT=%s\\n' "$MARQUEZ_PORT" "$MARQUEZ_PG_PORT" \\
  > "$MARQUEZ_RUN_DIR/env"
"""


def test_marquez_says_each_long_step_before_it_begins(tmp_path, monkeypatch):
    scripts = tmp_path / "marquez"
    scripts.mkdir()
    for name, text in (
        ("build.sh", "#!/bin/sh\nexit 0\n"),
        ("start.sh", START_SH.replace("{python}", sys.executable)),
        ("stop.sh", '#!/bin/sh\nkill "$(cat "$MARQUEZ_RUN_DIR/marquez.pid")"\n'),
    ):
        (scripts / name).write_text(text)
    monkeypatch.setattr(peers, "MARQUEZ_SCRIPTS", scripts)
    monkeypatch.delenv("MARQUEZ_URL", raising=False)
    said: list[str] = []
    marquez = peers.Marquez(said.append)
    try:
        marquez.start()
        assert [line.split(" ", 1)[0] for line in said] == ["building", "starting", "waiting"]
        assert "Maven" in said[0]
        assert f"Marquez at {marquez.url} to answer" in said[2]
    finally:
        marquez.remove(keep_logs=False)
    assert said[-1].startswith("stopping Marquez")


def test_the_lines_reach_the_terminal_past_pytests_capture(tmp_path):
    """The suite's own ``say`` fixture, in a pytest run with capture on (the default): a test
    that passes shows none of its output, yet the set-up's line is there."""
    tests = Path(__file__).parent
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(tests)!r})\nfrom e2e.conftest import say  # noqa: F401\n"
    )
    (tmp_path / "test_set_up.py").write_text(
        textwrap.dedent(
            """
            def test_a_long_step(say):
                print("hidden by the capture")
                say("building the peer (up to 600 s)")
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        # Capture is pytest's own: the installed plugins (xdist, asyncio, hypothesis) are not
        # loaded, a second of CPU saved at each start (1.4 s with them, 0.2 s without, here).
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[e2e set-up] building the peer (up to 600 s)" in done.stdout
    assert "hidden by the capture" not in done.stdout


def test_a_kafka_named_by_the_environment_is_used_as_it_is(tools):
    said: list[str] = []
    with socket.create_server(("127.0.0.1", 0)) as listening:
        servers = f"127.0.0.1:{listening.getsockname()[1]}"
        kafka = peers.ExternalKafka(servers, said.append).start()
        assert kafka.external
        assert kafka.bootstrap_servers == servers
        kafka.remove()  # never stopped: nothing happens
    assert said == [f"using the Kafka at {servers} (KAFKA_BOOTSTRAP_SERVERS)"]  # no jars resolved
    assert not peers.CACHE.exists()
    with pytest.raises(RuntimeError, match=rf"KAFKA_BOOTSTRAP_SERVERS='{servers}': nothing answers there"):
        peers.ExternalKafka(servers, said.append).start(timeout=5)


STRANGER = """
def test_kafka(apache_kafka):
    pass

def test_owned_kafka(owned_kafka):
    pass

def test_marquez(marquez):
    pass
"""


def run_like_a_stranger(tmp_path, **variables: str) -> str:
    """The e2e suite's fixtures in a pytest run with no peer: no Maven on PATH, no jars cached,
    no Marquez scripts; the summary of what was skipped, and why."""
    tests = Path(__file__).parent
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(tests)!r})\n"
        "from e2e.conftest import apache_kafka, marquez, owned_kafka, say  # noqa: F401\n"
    )
    (tmp_path / "test_stranger.py").write_text(STRANGER)
    (tmp_path / "bin").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MARQUEZ_", "KAFKA_", "CI"))}
    env |= {
        "PATH": str(tmp_path / "bin"),
        "OUTBOX_PEERS_CACHE": str(tmp_path / "cache"),
        "MARQUEZ_PEER_DIR": str(tmp_path / "no-such-folder"),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        **variables,
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_without_peers_the_suite_is_skipped_saying_how_to_run_it(tmp_path):
    summary = run_like_a_stranger(tmp_path)
    assert "3 skipped" in summary
    kafka = [line for line in summary.splitlines() if "Kafka could not start here" in line]
    assert len(kafka) == 2, summary  # the two tests that need Kafka
    assert "it needs Java 17+ and Maven, or set KAFKA_BOOTSTRAP_SERVERS to a running Kafka" in kafka[0]
    assert "docs/development.md, 'End to end against real peers'" in kafka[0]
    marquez = [line for line in summary.splitlines() if "no Marquez" in line]
    assert len(marquez) == 1, summary
    assert "set MARQUEZ_URL to a running Marquez, or MARQUEZ_PEER_DIR to the peer scripts" in marquez[0]
    assert "docs/development.md, 'End to end against real peers'" in marquez[0]


def test_with_a_kafka_of_ones_own_only_the_restarts_are_skipped(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as listening:
        servers = f"127.0.0.1:{listening.getsockname()[1]}"
        summary = run_like_a_stranger(tmp_path, KAFKA_BOOTSTRAP_SERVERS=servers)
    assert "1 passed, 2 skipped" in summary
    assert "KAFKA_BOOTSTRAP_SERVERS names a Kafka the suite does not own: it cannot restart it" in summary
