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

import httpx
import pytest
from e2e import peers

from outbox.tools import apache_kafka

from support.paths import TESTS

FAKE_MVN = """#!/bin/sh
for arg in "$@"; do
  case "$arg" in -DoutputDirectory=*) dir="${arg#-DoutputDirectory=}";; esac
done
mkdir -p "$dir" && touch "$dir/kafka.jar"
"""

FAKE_JAVA = """#!{python}
# Kafka as the harness sees it: StorageTool, then a node that speaks enough of the protocol
# (ApiVersions v0, Metadata v0-v1) to be asked for metadata.  As a KRaft node does before it
# has registered with its controller, it answers the first fake.empty.answers Metadata
# requests with no broker (controller -1); then broker 1, the controller.  Each answer is
# a line in fake-answers.log beside the properties.
import os, re, signal, socket, struct, sys, threading, uuid
args = sys.argv[1:]
if "kafka.tools.StorageTool" in args:
    print(uuid.uuid4()) if "random-uuid" in args else None
    sys.exit(0)
from aiokafka.protocol.admin import ApiVersionResponse_v0
from aiokafka.protocol.metadata import MetadataResponse_v0, MetadataResponse_v1
properties = open(args[-1]).read()
setting = lambda key, default: (re.findall(rf"^{{re.escape(key)}}=(.*)$", properties, re.M) or [default])[-1]
port = int(re.search(r"^listeners=PLAINTEXT://127.0.0.1:(\\d+)", properties, re.M).group(1))
empty = int(setting("fake.empty.answers", "0"))
answers = open(os.path.join(os.path.dirname(args[-1]), "fake-answers.log"), "a", buffering=1)
lock = threading.Lock()

def serve(conn):
    global empty
    with conn:
        while True:
            size = conn.recv(4, socket.MSG_WAITALL)
            if len(size) < 4:
                return
            request = conn.recv(struct.unpack(">i", size)[0], socket.MSG_WAITALL)
            api_key, version, correlation = struct.unpack(">hhi", request[:8])
            if api_key == 18:
                body = ApiVersionResponse_v0(0, [(18, 0, 0), (3, 0, 1)]).encode()
            else:
                with lock:
                    ready, empty = empty <= 0, empty - 1
                brokers = [(1, "127.0.0.1", port, None)] if ready else []
                answers.write("broker\\n" if ready else "empty\\n")
                if version == 0:
                    body = MetadataResponse_v0([b[:3] for b in brokers], []).encode()
                else:
                    body = MetadataResponse_v1(brokers, 1 if ready else -1, []).encode()
            message = struct.pack(">i", correlation) + body
            conn.sendall(struct.pack(">i", len(message)) + message)

server = socket.create_server(("127.0.0.1", port))
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
while True:
    threading.Thread(target=serve, args=(server.accept()[0],), daemon=True).start()
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
    monkeypatch.setattr(apache_kafka, "CACHE", tmp_path / "cache")
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
        assert (
            f"waiting up to 30 s for it to listen on {kafka.bootstrap_servers} and answer metadata "
            "with a broker and a controller" in said[-1]
        )
    finally:
        kafka.remove()
    assert said[-1].startswith(f"stopping Apache Kafka on {kafka.bootstrap_servers}")
    # Jars already resolved: that step is not long any more, and says nothing.
    said.clear()
    again = peers.ApacheKafka(said.append)
    assert said == []
    again.remove()


def test_kafka_is_used_only_once_its_metadata_names_a_broker_and_a_controller(tools):
    """The race CI met: the port open, the metadata still without a broker (aiokafka's admin
    client then failed creating a topic).  start() returns only after the answer with one."""
    kafka = peers.ApacheKafka(lambda line: None, properties={"fake.empty.answers": "5"})
    try:
        kafka.start(timeout=60)
        answers = (kafka.dir / "fake-answers.log").read_text().split()
        assert answers == ["empty"] * 5 + ["broker"]
        assert apache_kafka.metadata_answer(kafka.bootstrap_servers) == (
            True,
            "metadata with brokers [1] and controller 1",
        )
    finally:
        kafka.remove()


def test_kafka_that_never_serves_metadata_is_an_error_naming_it_and_its_last_answer(tools):
    kafka = peers.ApacheKafka(lambda line: None, properties={"fake.empty.answers": "1000000"})
    try:
        with pytest.raises(RuntimeError) as raised:
            # Long enough for its JVM to listen and answer beside CI's three suites and its e2e
            # peers (3 s was not: "did not listen"; 15 s once left its one answer a timeout),
            # which is what this test is not about.
            kafka.start(timeout=30)
        message = str(raised.value)
        assert message.startswith(
            f"Apache Kafka {apache_kafka.KAFKA_VERSION} on {kafka.bootstrap_servers} did not answer "
            "metadata with a broker and a controller within"
        ), message
        assert "it last answered: metadata with brokers none and controller -1" in message
        # What it waited for is stopped: nothing listens on its port any more.
        assert apache_kafka.metadata_answer(kafka.bootstrap_servers, timeout=1)[0] is False
        assert "ConnectionRefusedError" in apache_kafka.metadata_answer(kafka.bootstrap_servers, 1)[1]
    finally:
        kafka.remove()


def test_an_http_peer_that_does_not_answer_200_is_an_error_naming_it_and_its_last_answer():
    from outbox.tools.sink import Sink

    with Sink() as sink, pytest.raises(RuntimeError) as raised:
        peers.wait_for_http("outbox sink", f"{sink.url}/api/v1/nowhere", 1.0)  # a route it lacks
    message = str(raised.value)
    assert message.startswith(f"outbox sink did not answer GET {sink.url}/api/v1/nowhere with 200 within 1 s")
    assert "it last answered: 404" in message
    with pytest.raises(RuntimeError, match=r"it last answered: ConnectError"):
        peers.wait_for_http("outbox sink", f"{sink.url}/api/v1/events", 0.5)  # stopped now
    with peers.serving(Sink()) as serving:
        assert httpx.get(f"{serving.url}/api/v1/events").json() == []


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
    tests = TESTS
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
    assert not apache_kafka.CACHE.exists()
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
    tests = TESTS
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(tests)!r})\n"
        "from e2e.conftest import apache_kafka, marquez, owned_kafka, say  # noqa: F401\n"
    )
    (tmp_path / "test_stranger.py").write_text(STRANGER)
    (tmp_path / "bin").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MARQUEZ_", "KAFKA_", "CI"))}
    env |= {
        "PATH": str(tmp_path / "bin"),
        "LINEAGE_OUTBOX_PEERS_CACHE": str(tmp_path / "cache"),
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
