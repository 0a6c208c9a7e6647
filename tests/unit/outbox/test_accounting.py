"""Exact accounting under load: every event is delivered or counted under a reason."""

import resource
import threading

import pytest

from outbox import Outbox, Outcome
from outbox.transports import DELIVERED

from support.helpers import FailingTransport, ScriptedTransport

THREADS = 8
PER_THREAD = 20_000  # 160,000 emits: the buffer (2,000) overflows within the first few thousand


@pytest.mark.parametrize("policy", ["drop_oldest", "drop_newest", "block"])
def test_eight_threads_exact_accounting(policy):
    # A backend that rejects every 7th event and is slow enough for the buffer to overflow.
    def decide(event):
        return Outcome.rejected("rejected_by_backend", "422") if event["n"] % 7 == 0 else DELIVERED

    transport = ScriptedTransport(decide, delay=0.002)
    outbox = Outbox(
        transport, policy=policy, block_timeout=0.0005, max_events=2_000, linger=0.001, close_at_exit=False
    )
    accepted = [0] * THREADS
    barrier = threading.Barrier(THREADS)

    def worker(t: int) -> None:
        barrier.wait()
        body_prefix = b'{"eventType":"START","n":'
        for i in range(PER_THREAD):
            n = t * PER_THREAD + i
            accepted[t] += outbox.emit(body_prefix + str(n).encode() + b"}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = outbox.close(30)
    stats = outbox.stats()
    total = THREADS * PER_THREAD
    assert stats.emitted == total
    assert stats.accepted == sum(accepted)
    assert report.delivered + report.lost == total
    assert report.delivered == len(transport.delivered)
    assert report.undelivered.get("dropped_shutdown", 0) == 0
    rejected = report.undelivered.get("rejected_by_backend", 0)
    assert rejected == sum(1 for batch in transport.attempts for e in batch if e["n"] % 7 == 0)
    assert report.undelivered.get("dropped_full", 0) > 0  # the buffer did overflow
    if policy == "drop_oldest":
        assert stats.accepted == total  # drop_oldest never refuses the new event
    else:
        assert stats.accepted == total - report.undelivered["dropped_full"]
    # Nothing delivered twice.
    ns = [e["n"] for e in transport.delivered]
    assert len(ns) == len(set(ns))


FLOOD = 300_000  # about 380 bytes each: 114 MB were they kept (a million took 26-30 s beside load)


def test_a_flood_of_emits_into_a_dead_backend_stays_within_limits():
    max_events, max_bytes = 5_000, 1_000_000
    outbox = Outbox(
        FailingTransport(),
        max_events=max_events,
        max_bytes=max_bytes,
        backoff_base=0.001,
        backoff_cap=0.01,
        close_at_exit=False,
    )
    # A body of its own per event (one shared body would cost a kept event a pointer, not its
    # bytes, and the process's growth would not tell a bounded queue from an unbounded one).
    head = b'{"eventType":"START","run":{"runId":"00005015-0000-0016-2e04-8a6dbdde4eb9"},"n":'
    tail = b',"pad":"' + b"x" * 300 + b'"}'
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_events = peak_bytes = 0
    for i in range(FLOOD):
        outbox.emit(head + str(i).encode() + tail)
        if i % 10_000 == 0:
            stats = outbox.stats()
            peak_events = max(peak_events, stats.queued_events + stats.in_flight)
            peak_bytes = max(peak_bytes, stats.queued_bytes)
    stats = outbox.stats()
    assert peak_events <= max_events
    assert peak_bytes <= max_bytes
    assert stats.emitted == FLOOD
    assert stats.offered == stats.delivered + stats.lost + stats.queued_events + stats.in_flight
    # The process did not grow with the flood (its events kept, their bodies alone: 114 MB).
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert grown_kib < 40 * 1024, f"grew {grown_kib} KiB"
    report = outbox.close(0.2)
    assert report.delivered == 0
    assert sum(report.undelivered.values()) == FLOOD
