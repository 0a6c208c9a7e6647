"""Tests use public methods or the part's own interface, not ``box._buffer``-style reaches into
another object's private attributes (#38).  ``tests/support/parts.py`` is the one place that
looks inside an outbox; every other reach left is listed below with its reason, so the list can
only shrink.  A reach is ``x._name`` (not a dunder) where ``x`` is not ``self``/``cls``, not a
module's dotted name (a module's private setting, patched by a test, is the module's own
interface), and not a named tuple's ``_replace``/``_asdict``/``_fields``/``_make``.

Count them (this tree, or another checkout's ``tests``):

    .venv/bin/python tests/repo/test_reaches.py [TESTS_DIR]
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

#: Not counted: the one place that looks inside an outbox, and scripts for a person (not tests).
OUTSIDE = ("support/parts.py", "scripts/")

_TUPLE_API = {"_replace", "_asdict", "_fields", "_make"}

#: What is left, by file, each with why no public method or the part's own interface serves.
LEFT = {
    # The part under test: ending a sidecar's tasks on a loop of the test's own.
    "integration/runtime/test_lifecycle_faults.py": {"parts.sidecar(outbox)._end_tasks"},
    # The part under test: its own lock held at the fork, as another thread of the parent might.
    "integration/worker/test_dead_letter.py": {"dead._lock"},
    # The part under test: the rate limit forgotten between tests (it lasts for the process).
    "integration/transports/test_http_auth.py": {"kept._last"},
    # aiokafka's: no public "closed" on a producer.
    "integration/transports/test_kafka.py": {"o._closed"},
    # argparse's: no public list of a parser's subcommands and options.
    "tools/test_bench.py": {"parser._actions", "commands._choices_actions", "each._actions"},
    "tools/test_cli.py": {"parsers[0][1]._actions", "parser._actions"},
    # httpx's: a client's TLS context has no public reader.
    "tools/test_check.py": {"plain._transport", "secure._transport"},
    # The part under test (outbox forward): its clock-driven steps, one at a time.
    "tools/test_forward_clock.py": {
        "forwarder._consumer",
        "forwarder._offsets",
        "forwarder._failing_since",
        "forwarder._forward",
    },
    # The part under test (the slicer): a contended hand-off, set rather than staged.
    # and a settled lane let go in pieces (no public way to hand the worker a lane).
    "unit/outbox/test_hot_path.py": {"slicer._contended", "worker._free"},
    # openlineage-python's: the reference message key the outbox must equal.
    "unit/run/test_serde.py": {"reference._get_message_key"},
    # The part under test (the backlog): every held event in exactly one place.
    "unit/worker/test_backlog.py": {"backlog.keys._fresh"},
    # The part under test (the worker): a bug injected into one of its steps.
    "unit/worker/test_lanes.py": {"worker.intake._serialize", "worker._take", "worker._in_flight"},
    # The part under test (the Kafka transport): what an aiokafka error means, without a broker.
    "unit/worker/test_retry.py": {"transport._outcome"},
}


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__") and attr not in _TUPLE_API


def _dotted(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def reaches_in(source: str) -> list[str]:
    """Every reach in one file's source, once per place (a chain counted at its first private step)."""
    tree = ast.parse(source)
    imported = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        inner = node.value
        if isinstance(inner, ast.Name) and inner.id in ("self", "cls"):
            continue  # its own
        if _dotted(inner) and _root(inner) in imported:
            continue  # a module's private setting
        if isinstance(inner, ast.Attribute) and _private(inner.attr):
            continue  # counted at the chain's first private step
        found.append(ast.unparse(node))
    return found


def reaches(tests: Path = TESTS) -> dict[str, Counter[str]]:
    by_file: dict[str, Counter[str]] = {}
    for path in sorted(tests.rglob("*.py")):
        name = path.relative_to(tests).as_posix()
        if name.startswith(OUTSIDE):
            continue
        found = reaches_in(path.read_text())
        if found:
            by_file[name] = Counter(found)
    return by_file


def test_the_finder_sees_a_reach_and_passes_over_what_is_not_one():
    source = (
        "import outbox._spill._spill\n"
        "from support import parts\n"
        "box._buffer.queue\n"  # a reach, counted once
        "parts.sidecar(box)._end_tasks\n"  # a reach through a call
        "self._mine\n"  # its own
        "outbox._spill._spill.SCAN_INTERVAL\n"  # a module's setting
        "record._replace(seq=1)\n"  # a named tuple's method
        "box.__class__\n"  # a dunder
    )
    assert sorted(reaches_in(source)) == ["box._buffer", "parts.sidecar(box)._end_tasks"]


def test_tests_reach_into_no_other_objects_private_attributes_but_those_listed():
    found = {name: set(counts) for name, counts in reaches().items()}
    new = {
        name: sorted(exprs - LEFT.get(name, set()))
        for name, exprs in found.items()
        if exprs - LEFT.get(name, set())
    }
    gone = {
        name: sorted(exprs - found.get(name, set()))
        for name, exprs in LEFT.items()
        if exprs - found.get(name, set())
    }
    assert new == {}, "use support.parts, a public method or the part's own interface instead"
    assert gone == {}, "no longer there: take them off LEFT"


if __name__ == "__main__":
    counted = reaches(Path(sys.argv[1]) if len(sys.argv) > 1 else TESTS)
    for name, counts in counted.items():
        print(f"{sum(counts.values()):4}  {name}: {', '.join(sorted(counts))}")
    total = sum(sum(counts.values()) for counts in counted.values())
    print(f"{total} reaches in {len(counted)} files (outside {', '.join(OUTSIDE)})")
