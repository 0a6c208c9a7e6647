import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))  # the function/ package

import os
import uuid

import pytest


@pytest.fixture(scope="session")
def kafka_bootstrap():
    """A Kafka-protocol broker: $KAFKA_BOOTSTRAP_SERVERS if set, else an embedded Tansu."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    from outbox.tools.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.bootstrap_servers


@pytest.fixture
def topic():
    return f"lineage-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def session_timeout():
    """Consumer-group session for forwarders in tests: short on Tansu (its joins wait about
    half of it), Kafka's minimum (6 s) on an external broker."""
    return 6.0 if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") else 2.0
