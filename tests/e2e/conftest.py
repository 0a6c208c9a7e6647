import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))

from e2e.peers import ApacheKafka


@pytest.fixture(scope="session")
def apache_kafka():
    broker = ApacheKafka().start()
    try:
        yield broker
    finally:
        broker.remove()
