"""Where the suite's files are, whatever folder a test sits in: the tests folder (on
``sys.path``, so that ``support`` and ``e2e`` import) and the repository's root."""

from pathlib import Path

#: tests/: conftest.py, support/, scripts/, e2e/
TESTS = Path(__file__).parent.parent
#: the checkout: README.md, docs/, outbox/, function/, .ci/
REPO = TESTS.parent
