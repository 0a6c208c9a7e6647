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
