import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))

from e2e.peers import MARQUEZ_SCRIPTS, ApacheKafka, Marquez


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
    broker = ApacheKafka(say).start()
    try:
        yield broker
    finally:
        broker.remove()


@pytest.fixture(scope="session")
def marquez(request, say):
    """One Marquez for the session. In CI (CI=true) one that cannot start fails the suite;
    elsewhere, with neither the peer scripts nor MARQUEZ_URL, the Marquez tests are skipped."""
    if not Marquez.available():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no Marquez: set MARQUEZ_URL, or put the peer scripts at {MARQUEZ_SCRIPTS}")
        pytest.skip("no Marquez: set MARQUEZ_URL to a running Marquez, or MARQUEZ_PEER_DIR to its scripts")
    peer = Marquez(say)
    try:
        peer.start()
    except Exception as exc:
        peer.remove(keep_logs=True)
        if os.environ.get("CI") == "true":
            pytest.fail(f"Marquez could not start: {exc}")
        pytest.skip(f"Marquez could not start (set MARQUEZ_URL to use a running one): {exc}")
    failed_before = request.session.testsfailed
    try:
        yield peer
    finally:
        keep = request.session.testsfailed > failed_before
        peer.remove(keep_logs=keep)
        if keep:
            print(f"\nMarquez logs kept in {peer.dir}")
