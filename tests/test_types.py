"""The public API's types, as a user's type checker sees them."""

import os
import textwrap

from mypy import api


def test_mypy_accepts_every_kind_of_event_and_refuses_what_is_not_one(tmp_path):
    program = tmp_path / "user.py"
    program.write_text(
        textwrap.dedent(
            """
            from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

            import outbox


            class Foo:
                pass


            def use(box: outbox.Outbox, event: outbox.Event) -> None:
                run, job = Run(runId="0192f6b4-6c58-7cc5-b2a4-4f6b8e4b8a11"), Job(namespace="n", name="j")
                box.emit(RunEvent(eventType=RunState.START, eventTime="t", run=run, job=job))
                box.emit({"eventType": "START"})
                box.emit('{"eventType": "START"}')
                box.emit(b"{}")
                box.emit(event)
                box.emit(Foo())  # line 18
            """
        )
    )
    # A cache kept between runs if CI names one (.ci/run does): cold, mypy spends 20-40 s of
    # CPU on outbox and openlineage's modules; its cache is checked against each module's hash.
    cache = os.environ.get("LINEAGE_OUTBOX_TEST_MYPY_CACHE") or str(tmp_path / "cache")
    out, err, status = api.run(["--strict", "--no-error-summary", "--cache-dir", cache, str(program)])
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1, out + err
    assert len(errors) == 1, out
    # user.py's own path is not compared: from its cache mypy repeats an unchanged module's
    # errors under the path it had when it was checked (another run's tmp_path).
    assert 'user.py:18: error: Argument 1 to "emit" of "Outbox" has incompatible type "Foo"' in errors[0]
