"""A handler that computes without pause, shipping to `outbox sink` in its own process: the
sidecar, which gets the GIL from such a handler only at a switch interval, still delivers every
event (the hot path's other promises, in one process: tests/unit/outbox/test_hot_path.py)."""

import pytest

from outbox import LineageJob, Outbox, s3_dataset


@pytest.mark.slow
@pytest.mark.parametrize("work_us", [50, 200])
def test_a_handler_that_computes_without_pause_loses_nothing_to_a_healthy_sink(work_us):
    # 10,000 invocations of the run helpers back to back, each after work_us of pure-Python
    # work (about 30,000 and 9,000 events/s, below what the sidecar ships alone), the
    # defaults, `outbox sink` in its own process: every event delivered, none dropped.  (The
    # sidecar gets the GIL from such a handler only at a switch interval: it must not give
    # its turns away, #37.)  `tail --rows busy` prints the same, three runs a row.
    import os
    import time

    from opentelemetry import context, trace

    from outbox.tools.benchmarks import throughput

    with throughput.Server(*throughput.SINK) as url:
        env = {"OPENLINEAGE_URL": url}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            outbox = Outbox.from_env()
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        job = LineageJob("tests", "busy")
        with outbox.run(job):
            pass
        assert outbox.flush(30)  # the sidecar started, its connection made
        spans = [trace.NonRecordingSpan(trace.SpanContext(i + 1, 1, is_remote=False)) for i in range(10_000)]
        contexts = [trace.set_span_in_context(span) for span in spans]
        clock, work = time.perf_counter_ns, work_us * 1000
        for i, ctx in enumerate(contexts):
            until = clock() + work
            while clock() < until:
                pass
            token = context.attach(ctx)
            with outbox.run(job, inputs=[s3_dataset("bucket", f"{i}.csv")]):
                pass
            context.detach(token)
        report = outbox.close(60)
    assert dict(report.undelivered) == {}
    assert report.delivered == 20_002


def test_a_handler_that_emits_without_pause_into_a_full_buffer_leaves_the_sidecar_delivering(tmp_path):
    """A loop of emits that never waits, far beyond what any sidecar ships: the buffer is full
    and drop_oldest evicts, the evicted objects waiting to be freed past their bound, so each
    emit asks for the sidecar.  Each wake-up was a byte to the loop's self-pipe, which the loop
    reads until it is empty, a system call a byte, each waiting out a switch interval beside
    this thread: the loop read wake-ups for as long as the handler ran and delivered nothing
    (0 of 2,000,000 emitted in 2 s, the file never made; a lifecycle test's child "did not
    begin").  One wake-up is on its way at a time now."""
    import time

    from outbox.transports import FileTransport

    path = tmp_path / "events.jsonl"
    outbox = Outbox(FileTransport(str(path), append=True), max_events=2000, linger=0.05, close_at_exit=False)
    event = {"eventType": "START", "run": {"runId": "r"}, "job": {"namespace": "n", "name": "j"}}
    end = time.monotonic() + 2
    while time.monotonic() < end:
        outbox.emit(event)
    delivered = outbox.stats().delivered  # (read before the close, which drains what is left)
    report = outbox.close(10)
    assert delivered > 0, report
    assert report.emitted == report.delivered + sum(report.undelivered.values())
