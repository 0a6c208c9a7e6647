import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))  # the function/ package

import contextlib
import os
import uuid

import pytest
from _pytest._code.code import ReprFileLocation, TerminalRepr
from hypothesis import HealthCheck, settings

# Property tests judge outcomes, never speed: no per-example deadline (hypothesis's default of
# 200 ms fails an example that a loaded machine merely delays) and no "too slow" health check.
# In CI (.ci/run sets HYPOTHESIS_PROFILE=ci) the examples are derandomized: the same ones every
# run, so a run cannot fail on an example the previous one never tried.  Elsewhere they are
# random, so runs on a developer's machine keep exploring.
settings.register_profile("outbox", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("outbox"), derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "outbox"))

# A logger registered on another thread races pytest, which walks logging's loggerDict without
# logging's lock as each phase of a test begins ("dictionary changed size during iteration", a
# test failed in its setup, 1 CI run in many beside load): openlineage-python's async_http
# transport imports httpcore2 on its own thread when it first sends: imported here first, on the
# main thread.
with contextlib.suppress(ImportError):
    import httpcore2  # noqa: F401


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


_INTERNALS = ("/_pytest/", "/pluggy/")


def _trimmed(exc: BaseException) -> str:
    """The exception's traceback (and its causes') without pytest's and pluggy's frames: a
    failure reads from the test to the assertion, not through 70 lines of the runner."""
    import traceback

    te = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    stack: list[traceback.TracebackException] = [te]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        kept = [frame for frame in current.stack if not any(part in frame.filename for part in _INTERNALS)]
        current.stack = traceback.StackSummary.from_list(kept)
        stack += [e for e in (current.__cause__, current.__context__) if e is not None]
    return "".join(te.format())


class _TrimmedRepr(TerminalRepr):
    def __init__(self, text: str, crash: ReprFileLocation | None) -> None:
        self.text = text
        self.reprcrash = crash  # what the short summary line shows

    def toterminal(self, tw) -> None:
        for line in self.text.rstrip("\n").splitlines():
            tw.line(line)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    excinfo = call.excinfo
    if report.failed and excinfo is not None and not isinstance(excinfo.value, pytest.skip.Exception):
        crash = getattr(report.longrepr, "reprcrash", None)
        report.longrepr = _TrimmedRepr(_trimmed(excinfo.value), crash)


def pytest_collection_modifyitems(config, items):
    """The end-to-end suite (marked e2e) runs only when -m names it, as in ``pytest -m e2e
    tests/e2e``: the default run and any other selection (``-m "not slow"``) leave it out.
    The tests marked slow run first."""
    if "e2e" not in (config.option.markexpr or ""):
        left = [item for item in items if item.get_closest_marker("e2e")]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = [item for item in items if not item.get_closest_marker("e2e")]
    # The long ones (marked slow, the chaos tests longest) first: with workers (-n 4) they start
    # at once, beside the others, instead of being the last to begin and the last to end.
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, "chaos" not in item.nodeid))
