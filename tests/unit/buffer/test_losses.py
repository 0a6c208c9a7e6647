"""The buffer's count of lost events (``Losses``): every event counted once, under the reason
of its moment, never zero or below, ``put``'s fast path in its cell; and ``dropped`` read from
another thread (as ``stats()`` and the metrics read it, without the lock) never goes backwards.
(From a hostile review of the change that made the fast path count in a cell.)"""

from __future__ import annotations

import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox._buffer._buffer import Buffer, Policy, Reason, count_held_locked
from outbox._buffer._holdings import Admission
from outbox._buffer._numbering import DELIVERED

BUF_OPS = (
    "put_object",
    "put_object",
    "put_object",
    "put_text",
    "spill_full",
    "take",
    "untake",
    "deliver",
    "lose",
    "grow",
    "look",
    "count",
    "move",
    "close",
)


def _positive_and_adds_up(buf, refused_by_reason):
    dropped = buf.dropped
    assert all(n > 0 for n in dropped.values()), dropped
    held = len(buf.holdings.queue) + buf.holdings.in_flight
    lost = sum(n for r, n in dropped.items() if r not in (Reason.AFTER_CLOSE, Reason.DISABLED))
    assert buf.emitted == buf.delivered + lost + held, (buf.emitted, buf.delivered, dropped, held)
    # Numbered losses are in the journal (each number once), refusals were seen by put's caller.
    settled: dict[str, int] = {}
    seen: set[int] = set()
    for first, end, outcome in buf.holdings.journal.entries:
        assert not seen & set(range(first, end)), (first, end)
        seen |= set(range(first, end))
        settled[outcome] = settled.get(outcome, 0) + end - first
    assert settled.pop(DELIVERED, 0) == buf.delivered
    want = dict(settled)
    for r, n in refused_by_reason.items():
        want[r] = want.get(r, 0) + n
    assert dropped == {r: n for r, n in want.items() if n}, (dropped, want)


@pytest.mark.parametrize("policy", [Policy.DROP_OLDEST, Policy.DROP_NEWEST])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_buffer_counts_each_event_once_under_its_reason(policy, data):
    buf = Buffer(max_events=data.draw(st.integers(1, 8)), max_bytes=100_000, policy=policy, block_timeout=0.0)
    held = buf.holdings
    refused: dict[str, int] = {}
    in_flight: list = []  # entries taken, not settled
    last_take: list = []
    with buf.lock:
        held.keep_journal_locked()
        buf.learn_locked(300)
        buf.looked_locked(held.next_seq)
    for _ in range(data.draw(st.integers(1, 80))):
        op = data.draw(st.sampled_from(BUF_OPS))
        if op in ("put_object", "put_text"):
            reason = buf.full_reason if not held.closed else buf.refusal
            before = buf.refused
            if op == "put_object":
                result = buf.put({"eventType": "START"}, 0)
            else:
                result = buf.put(b'{"eventType":"START"}', 20)
            if result is Admission.REFUSED:
                assert buf.refused == before + (0 if held.closed else 1)
                refused[reason] = refused.get(reason, 0) + 1
        else:
            with buf.lock:
                if op == "spill_full":
                    buf.spill_full_locked(data.draw(st.booleans()))
                elif op == "take" and not held.closed:
                    got = held.take_locked(data.draw(st.integers(1, 5)), 100_000)
                    if got:
                        in_flight += got
                        last_take = got
                elif op == "untake" and last_take:
                    k = data.draw(st.integers(1, len(last_take)))
                    back = last_take[-k:]
                    if all(e in in_flight for e in back) and held.untake_locked(back):
                        for e in back:
                            in_flight.remove(e)
                    last_take = []
                elif op in ("deliver", "lose") and in_flight:
                    k = data.draw(st.integers(1, len(in_flight)))
                    done, in_flight[:k] = in_flight[:k], []
                    last_take = []
                    if op == "deliver":
                        buf.record_answer_locked(len(done), 0)
                        held.note_each_locked((e[0] for e in done), DELIVERED)
                    else:
                        buf.count_locked(Reason.REJECTED_BY_BACKEND, len(done))
                        held.note_each_locked((e[0] for e in done), Reason.REJECTED_BY_BACKEND)
                    low = min((e[0] for e in in_flight), default=float("inf"))
                    buf.settle_locked(len(done), sum(e[2] for e in done), low)
                elif op == "grow":
                    buf.learn_locked(data.draw(st.integers(300, 40_000)))  # may shed by the policy
                elif op == "look":
                    buf.looked_locked(held.next_seq)
                elif op == "count":
                    r = data.draw(st.sampled_from([Reason.INVALID_EVENT, Reason.DROPPED_FULL]))
                    buf.drop_offered_locked(r)
                    refused[r] = refused.get(r, 0) + 1
                elif op == "move":  # the sidecar's stop: shutdown's losses counted as the stop's
                    have = buf.dropped.get(Reason.DROPPED_SHUTDOWN, 0)
                    if have:
                        buf.count_locked(Reason.DROPPED_SHUTDOWN, -have)
                        buf.count_locked(Reason.WORKER_STOPPED, have)
                        refused[Reason.DROPPED_SHUTDOWN] = refused.get(Reason.DROPPED_SHUTDOWN, 0) - have
                        refused[Reason.WORKER_STOPPED] = refused.get(Reason.WORKER_STOPPED, 0) + have
                elif op == "close" and not held.closed:
                    # what is queued is lost to shutdown (in flight: settled as lost first)
                    if in_flight:
                        buf.count_locked(Reason.DROPPED_SHUTDOWN, len(in_flight))
                        held.note_each_locked((e[0] for e in in_flight), Reason.DROPPED_SHUTDOWN)
                        buf.settle_locked(len(in_flight), sum(e[2] for e in in_flight), float("inf"))
                        in_flight, last_take = [], []
                    n = len(held.queue)
                    for seq in [held.numbers.seq_at(i) for i in range(n)]:
                        held.note_locked(seq, seq + 1, Reason.DROPPED_SHUTDOWN)
                    count_held_locked(buf, 0, Reason.DROPPED_SHUTDOWN)
                    buf.close_locked()
        with buf.lock:
            _positive_and_adds_up(buf, refused)


@pytest.mark.parametrize("policy", [Policy.DROP_OLDEST, Policy.DROP_NEWEST])
def test_dropped_read_from_another_thread_never_goes_backwards(policy):
    buf = Buffer(max_events=16, max_bytes=10_000_000, policy=policy, block_timeout=0.0)
    with buf.lock:
        buf.learn_locked(300)
    stop = threading.Event()
    seen: list[str] = []

    def emitter() -> None:
        i = 0
        while not stop.is_set():
            buf.put({"eventType": "START"}, 0)
            i += 1
            if i % 97 == 0:
                with buf.lock:
                    buf.spill_full_locked(i % 194 == 0)
                    buf.looked_locked(buf.holdings.next_seq)
            if i % 301 == 0:
                with buf.lock:
                    buf.drop_offered_locked(Reason.INVALID_EVENT)

    def reader() -> None:
        last: dict[str, int] = {}
        total = 0
        while not stop.is_set():
            now = buf.dropped  # without the lock, as metrics and stats may
            if any(n <= 0 for n in now.values()):
                seen.append(f"zero or below: {now}")
            for r, n in last.items():
                if now.get(r, 0) < n:
                    seen.append(f"{r} went back: {last} then {now}")
            if sum(now.values()) < total:
                seen.append(f"total went back: {last} then {now}")
            last, total = now, sum(now.values())

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [
            threading.Thread(target=emitter),
            threading.Thread(target=reader),
            threading.Thread(target=reader),
        ]
        for t in threads:
            t.start()
        stop.wait(2.0)
        stop.set()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not seen, seen[:3]
    with buf.lock:
        dropped = buf.dropped
        assert dropped.get(Reason.DROPPED_FULL, 0) > 100, dropped
        assert dropped.get(Reason.DROPPED_SPILL_FULL, 0) > 100, dropped
        assert buf.emitted == sum(dropped.values()) + len(buf.holdings.queue)
        # (dropped on ``put``'s fast path, in both reasons' cells)
        assert buf.full_drops[0] > 0
        assert all(buf.losses.cell(r)[0] > 0 for r in (Reason.DROPPED_FULL, Reason.DROPPED_SPILL_FULL))
