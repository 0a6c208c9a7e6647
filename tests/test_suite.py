"""The test suite's own promises: a failure reads from the test to the assertion."""

from pathlib import Path

pytest_plugins = ["pytester"]


def test_a_failing_test_prints_its_own_frames_not_the_runners(pytester):
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        test_demo="""
        def helper(x):
            assert x == 2, "x should be 2"

        def test_fails():
            helper(1)
        """
    )
    result = pytester.runpytest_subprocess("--tb=native", "-q")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "_pytest" not in out, out
    assert "pluggy" not in out, out
    assert "in test_fails" in out
    assert "in helper" in out
    assert "FAILED test_demo.py::test_fails - AssertionError: x should be 2" in out
    failure = out.split("FAILURES")[1].split("short test summary")[0]
    assert len(failure.splitlines()) < 15, failure


def test_not_slow_leaves_out_the_slow_tests_and_never_starts_the_end_to_end_suite(pytester):
    """.ci/run appends -m "not slow" to the README's command on 3.12 and 3.13: that must not
    select the e2e tests, which the default run leaves out and -m e2e alone runs."""
    root = Path(__file__).parent.parent
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    (pytester.path / "pyproject.toml").write_text((root / "pyproject.toml").read_text())
    pytester.makepyfile(
        test_fast="def test_fast(): pass",
        test_slow="import pytest\n\n@pytest.mark.slow\ndef test_slow(): pass",
    )
    (pytester.path / "e2e").mkdir()
    (pytester.path / "e2e" / "test_peer.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.e2e\n\ndef test_peer(): pass\n"
    )

    def selected(*args: str) -> set[str]:
        result = pytester.runpytest("--collect-only", "-q", *args)
        assert result.ret == 0, result.stdout.str()
        return {line.split("::")[-1] for line in result.stdout.lines if "::" in line}

    assert selected() == {"test_fast", "test_slow"}
    assert selected("-m", "not slow") == {"test_fast"}
    assert selected("-m", "e2e", "e2e") == {"test_peer"}
