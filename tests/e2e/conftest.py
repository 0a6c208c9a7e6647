import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))

from e2e.peers import MARQUEZ_SCRIPTS, ApacheKafka, ExternalKafka, Marquez

#: Where a stranger reads how to run the suite against peers of their own.
HOW = "docs/development.md, 'End to end against real peers'"


@pytest.fixture(scope="session")
def say(request):
    """A line on the terminal now, past pytest's capture: the set-up's long steps (building
    Marquez, downloading Kafka's jars, starting the peers) say what they wait for."""
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:
        with capture.global_and_fixture_disabled():
            print(f"\n[e2e set-up] {line}", flush=True)

    return say


@pytest.fixture(scope="session")
def apache_kafka(say):
    """One Kafka for the session: the one ``KAFKA_BOOTSTRAP_SERVERS`` names, or Apache Kafka
    started here.  In CI (CI=true) one that cannot start fails the suite; elsewhere the tests
    that need it are skipped, saying how to run them."""
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    try:
        broker = ExternalKafka(servers, say).start() if servers else ApacheKafka(say).start()
    except Exception as exc:
        if os.environ.get("CI") == "true" or servers:
            pytest.fail(f"Kafka could not start: {exc}")
        pytest.skip(
            f"Kafka could not start here ({exc}): it needs Java 17+ and Maven, or set "
            f"KAFKA_BOOTSTRAP_SERVERS to a running Kafka ({HOW})"
        )
    try:
        yield broker
    finally:
        broker.remove()


@pytest.fixture
def owned_kafka(apache_kafka):
    """The session's Kafka, for a test that stops, kills or restarts it: only one the suite
    started itself."""
    if apache_kafka.external:
        pytest.skip("KAFKA_BOOTSTRAP_SERVERS names a Kafka the suite does not own: it cannot restart it")
    return apache_kafka


@pytest.fixture(scope="session")
def marquez(request, say):
    """One Marquez for the session. In CI (CI=true) one that cannot start fails the suite;
    elsewhere, with neither the peer scripts nor MARQUEZ_URL, the Marquez tests are skipped."""
    if not Marquez.available():
        if os.environ.get("CI") == "true":
            pytest.fail(
                f"no Marquez: no peer scripts at {MARQUEZ_SCRIPTS}; set MARQUEZ_PEER_DIR to them, or "
                f"MARQUEZ_URL to a running Marquez ({HOW})"
            )
        pytest.skip(
            f"no Marquez: no peer scripts at {MARQUEZ_SCRIPTS}; set MARQUEZ_URL to a running Marquez, "
            f"or MARQUEZ_PEER_DIR to the peer scripts ({HOW})"
        )
    peer = Marquez(say)
    try:
        peer.start()
    except Exception as exc:
        peer.remove(keep_logs=True)
        if os.environ.get("CI") == "true":
            pytest.fail(f"Marquez could not start: {exc}")
        pytest.skip(f"Marquez could not start (set MARQUEZ_URL to use a running one, {HOW}): {exc}")
    failed_before = request.session.testsfailed
    try:
        yield peer
    finally:
        keep = request.session.testsfailed > failed_before
        peer.remove(keep_logs=keep)
        if keep:
            print(f"\nMarquez logs kept in {peer.dir}")
