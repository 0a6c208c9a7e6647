"""The backlog (``outbox._worker._backlog``): one FIFO per order key, keys muted while their events are on
the wire, isolation of events the backend refuses, and the poison ledger.  Pure: no threads,
no transport, time passed in."""

from __future__ import annotations

import random

import orjson
import pytest

from outbox import About, Outcome
from outbox._run._serde import SerializedEvent
from outbox._worker._backlog import Backlog
from outbox._worker._held import Held, Key, order_key

DELIVERED = Outcome.delivered()
REFUSED = Outcome.retry("http_500", "cannot map", about=About.EVENT)  # this very event
WHOLE = Outcome.retry("http_500", "cannot map", about=About.REQUEST)  # one of the request's
DOWN = Outcome.retry("http_503", "down")


def held(seq: int, run: str | None = None, key: str | None = None, pad: int = 0) -> Held:
    body = orjson.dumps({"seq": seq, "pad": "x" * pad} if pad else {"seq": seq})
    return Held(seq, SerializedEvent(body, run, key), len(body))


def key_of(item: Held) -> Key:
    """A held event's order key, as the worker computes it."""
    return order_key(item.event, item.seq)


def no_wait(refusals: int, retry_after: float | None, about_event: bool) -> float:
    return 0.0


def test_one_definition_of_the_order_key_run_id_else_message_key_else_the_event_itself():
    assert key_of(held(1, run="r", key="job:ns/a")) == "r"
    assert key_of(held(2, key="job:ns/a")) == "job:ns/a"
    assert key_of(held(3)) == 3
    assert key_of(held(4)) != key_of(held(5))
    # HTTP's single mode keys a request's events by the same definition, its index for a number.
    assert order_key(SerializedEvent(b"{}", None, None), 7) == 7


def test_a_key_whose_events_are_on_the_wire_is_muted_and_its_later_events_wait():
    backlog = Backlog(poison_attempts=5)
    backlog.add([held(0, run="a"), held(1, run="b"), held(2, run="a")])
    lane = backlog.take_lane(0.0, most_events=2, most_bytes=1 << 20)
    assert [i.seq for i in lane] == [0, 2]  # key a whole, its order kept
    backlog.add([held(3, run="a")])
    second = backlog.take_lane(0.0, most_events=10, most_bytes=1 << 20)
    assert [i.seq for i in second] == [1]  # a is muted: its new event waits, b goes
    assert backlog.take_lane(0.0, 10, 1 << 20) == []
    # Key a's later event is held and not on the wire, but no lane can take it: nothing to
    # wake for (a worker told otherwise would spin until the answer came).
    assert backlog.ready == 1
    assert not backlog.can_send(0.0)
    backlog.settle(lane, [DELIVERED, DELIVERED], 0.1, no_wait)
    assert backlog.can_send(0.1)
    assert [i.seq for i in backlog.take_lane(0.1, 10, 1 << 20)] == [3]


def test_job_and_dataset_events_that_share_a_key_keep_their_order_through_retries():
    """Events without a run, with the same message key (a job's events), are one key: a retried
    one is never overtaken by a later one."""
    backlog = Backlog(poison_attempts=5)
    backlog.add([held(0, key="job:ns/j"), held(1, key="dataset:ns/d"), held(2, key="job:ns/j")])
    lane = backlog.take_lane(0.0, 1, 1 << 20)  # one event per lane
    assert [i.seq for i in lane] == [0]
    other = backlog.take_lane(0.0, 1, 1 << 20)
    assert [i.seq for i in other] == [1]
    assert backlog.take_lane(0.0, 1, 1 << 20) == []  # 2 waits behind 0
    backlog.settle(lane, [DOWN], 0.0, no_wait)
    again = backlog.take_lane(0.0, 1, 1 << 20)
    assert [i.seq for i in again] == [0]  # the retried one first, then 2
    backlog.settle(again, [DELIVERED], 0.0, no_wait)
    assert [i.seq for i in backlog.take_lane(0.0, 1, 1 << 20)] == [2]


def test_a_lane_never_splits_a_key_except_at_its_size_and_then_the_rest_waits():
    backlog = Backlog(poison_attempts=5)
    backlog.add([held(i, run="a") for i in range(5)] + [held(5, run="b")])
    lane = backlog.take_lane(0.0, most_events=3, most_bytes=1 << 20)
    assert [i.seq for i in lane] == [0, 1, 2]
    assert [i.seq for i in backlog.take_lane(0.0, 3, 1 << 20)] == [5]  # a's rest waits for a
    backlog.settle(lane, [DELIVERED] * 3, 0.0, no_wait)
    assert [i.seq for i in backlog.take_lane(0.0, 3, 1 << 20)] == [3, 4]


def test_a_retry_waits_its_backoff_and_holds_back_only_its_key():
    backlog = Backlog(poison_attempts=5)
    backlog.add([held(0, run="a"), held(1, run="b")])
    lane = backlog.take_lane(0.0, 1, 1 << 20)
    backlog.settle(lane, [DOWN], 0.0, lambda *a: 1.0)
    assert backlog.resting == 1
    assert [i.seq for i in backlog.take_lane(0.0, 10, 1 << 20)] == [1]
    assert backlog.next_ready_at(0.5) == 1.0
    assert backlog.take_lane(0.5, 10, 1 << 20) == []
    assert [i.seq for i in backlog.take_lane(1.0, 10, 1 << 20)] == [0]
    assert backlog.resting == 0


def test_a_request_of_several_keys_refused_as_a_whole_is_bisected_by_keys():
    backlog = Backlog(poison_attempts=5)
    backlog.add([held(i, run=f"r{i}") for i in range(8)])
    lane = backlog.take_lane(0.0, 100, 1 << 20)
    backlog.settle(lane, [WHOLE] * 8, 0.0, no_wait)
    assert backlog.split_to == 4
    halves = [backlog.take_lane(0.0, 100, 1 << 20) for _ in range(2)]
    assert [len(h) for h in halves] == [4, 4]
    backlog.settle(halves[0], [DELIVERED] * 4, 0.1, no_wait)  # the good half goes through
    assert backlog.split_to == 8  # doubled back
    backlog.settle(halves[1], [WHOLE] * 4, 0.1, no_wait)  # the bad one is halved again
    assert backlog.split_to == 2
    quarters = [backlog.take_lane(0.1, 100, 1 << 20) for _ in range(2)]
    assert sorted(len(q) for q in quarters) == [2, 2]
    assert backlog.take_lane(0.1, 100, 1 << 20) == []


def test_an_event_refused_alone_while_others_go_through_is_settled_as_poison():
    backlog = Backlog(poison_attempts=3)
    backlog.add([held(0, run="p"), held(1, run="p"), held(2, run="ok")])
    lane = backlog.take_lane(0.0, 100, 1 << 20)
    # The backend answers per event: took the other run, refused p's first (its second waits).
    settled = backlog.settle(lane, [REFUSED, Outcome.deferred(), DELIVERED], 0.0, no_wait)
    assert [i.seq for i in settled.delivered] == [2]
    for attempt in range(2):
        lane = backlog.take_lane(float(attempt + 1), 100, 1 << 20)
        assert [i.seq for i in lane] == [0, 1]
        settled = backlog.settle(lane, [REFUSED, Outcome.deferred()], float(attempt + 1), no_wait)
    assert [i.seq for i, _ in settled.poison] == [0]
    lane = backlog.take_lane(3.0, 100, 1 << 20)
    assert [i.seq for i in lane] == [1]  # its run goes on
    backlog.settle(lane, [DELIVERED], 3.0, no_wait)
    assert len(backlog) == 0


def test_a_backend_that_takes_nothing_is_down_and_nothing_is_settled_as_poison():
    backlog = Backlog(poison_attempts=2)
    backlog.add([held(0, run="p")])
    for attempt in range(10):
        lane = backlog.take_lane(float(attempt), 100, 1 << 20)
        settled = backlog.settle(lane, [REFUSED], float(attempt), no_wait)
        assert settled.poison == []  # no evidence: the backend took nothing since
    assert len(backlog) == 1


def test_a_key_whose_several_events_are_refused_as_a_whole_sends_its_head_alone_next():
    """A request of one key's events refused as a whole (a Kafka producer batch over the
    topic's max.message.bytes, say) says the trouble is in what it carried: the key's head
    goes alone next, whether or not the backend took anything else meanwhile, and the rest
    follows it in order.  Refused alone, the head is a poison suspect like any other."""
    backlog = Backlog(poison_attempts=5)
    backlog.add([held(1, run="p"), held(2, run="p"), held(3, run="p")])
    lane = backlog.take_lane(0.0, 3, 1 << 20)
    backlog.settle(lane, [WHOLE] * 3, 0.0, no_wait)  # nothing taken, ever: no evidence
    head = backlog.take_lane(0.1, 3, 1 << 20)
    assert [i.seq for i in head] == [1]  # its head alone
    assert not backlog.can_send(0.1)  # the rest waits behind it
    backlog.settle(head, [DELIVERED], 0.1, no_wait)
    assert [i.seq for i in backlog.take_lane(0.2, 3, 1 << 20)] == [2, 3]  # then the rest, together


def test_deferred_events_go_again_at_once_and_a_transport_that_only_defers_cannot_spin():
    backlog = Backlog(poison_attempts=5)
    backlog.add([held(0, run="a"), held(1, run="b")])
    lane = backlog.take_lane(0.0, 10, 1 << 20)
    backlog.settle(lane, [DELIVERED, Outcome.deferred()], 0.0, lambda *a: 1.0)
    assert [i.seq for i in backlog.take_lane(0.0, 10, 1 << 20)] == [1]  # at once: something moved
    lane = [held(1, run="b")]
    backlog = Backlog(poison_attempts=5)
    backlog.add(lane)
    taken = backlog.take_lane(0.0, 10, 1 << 20)
    backlog.settle(taken, [Outcome.deferred()], 0.0, lambda *a: 0.05)
    assert backlog.take_lane(0.0, 10, 1 << 20) == []  # nothing moved: a pause
    assert [i.seq for i in backlog.take_lane(0.05, 10, 1 << 20)] == [1]


def test_the_oldest_event_held_and_a_lane_whose_answer_is_lost():
    backlog = Backlog(poison_attempts=5)
    assert backlog.lowest_seq() == float("inf")
    backlog.add([held(3, run="a"), held(5, run="b"), held(7, run="a")])
    assert backlog.lowest_seq() == 3
    lane = backlog.take_lane(0.0, 1, 1 << 20)
    backlog.settle(lane, [DELIVERED], 0.0, no_wait)
    assert backlog.lowest_seq() == 5
    lane = backlog.take_lane(0.0, 10, 1 << 20)
    backlog.release(lane, 0.0)  # cut by the close deadline: its keys go again as they are
    again = backlog.take_lane(0.0, 10, 1 << 20)
    assert [i.seq for i in again] == [5, 7]
    backlog.release(again, 0.0)
    assert [i.seq for i in backlog.drain()] == [5, 7]
    assert len(backlog) == 0


def test_while_the_backend_fails_the_key_refused_fewest_times_goes_first():
    backlog = Backlog(poison_attempts=5)
    backlog.add([held(0, run="p"), held(1, run="ok")])
    for t in range(3):
        lane = backlog.take_lane(float(t), 1, 1 << 20, fair=False)
        assert [i.seq for i in lane] == [0]  # oldest first
        backlog.settle(lane, [REFUSED], float(t), no_wait)
    lane = backlog.take_lane(3.0, 1, 1 << 20, fair=True)
    assert [i.seq for i in lane] == [1]  # never refused: its turn


def test_a_keys_events_added_while_an_earlier_group_waits_in_fresh_keep_their_order():
    """Fresh groups of one key from several adds: a later add while the key is on the wire
    must not go ahead of the key's group still waiting (it joins the key's FIFO only when that
    group does)."""
    backlog = Backlog(poison_attempts=5)
    backlog.add([held(0, run="a")])
    backlog.add([held(1, run="a")])
    lane = backlog.take_lane(0.0, 1, 1 << 20)
    assert [i.seq for i in lane] == [0]
    backlog.add([held(2, run="a")])
    backlog.settle(lane, [DELIVERED], 0.0, no_wait)
    taken = []
    while backlog:
        lane = backlog.take_lane(0.0, 1, 1 << 20)
        taken += [i.seq for i in lane]
        backlog.settle(lane, [DELIVERED] * len(lane), 0.0, no_wait)
    assert taken == [1, 2]


def _check_places(backlog: Backlog, on_wire: dict[int, Held]) -> None:
    """Every held event in exactly one place; the counts agree."""
    seen: dict[int, str] = {}
    for group in backlog.keys._fresh:
        for item in group:
            assert item.seq not in seen
            seen[item.seq] = "fresh"
    for state in backlog.keys.states.values():
        for item in getattr(state, "fifo", ()):
            assert item.seq not in seen
            seen[item.seq] = "fifo"
    for seq in on_wire:
        assert seen.get(seq, "fifo") == "fifo"  # on the wire: at its FIFO's front, or nowhere
    assert len(set(seen) | set(on_wire)) == backlog.items == len(backlog)
    assert backlog.in_lanes == len(on_wire)


@pytest.mark.parametrize("seed", range(40))
def test_random_adds_lanes_and_answers_keep_each_keys_order_and_every_event_once(seed):
    """A model run: events of a few keys added in random slices, lanes taken with random limits
    and answered at random (delivered, refused about the backend or the request, deferred,
    partly delivered, or lost), with other lanes on the wire meanwhile.  Each key's events go
    out and are delivered in order, none is on the wire twice at once, the counts agree, and
    everything is delivered in the end.  Events weigh from a few bytes to a few hundred, and a
    lane's bytes are held to its limit (one event alone may exceed it)."""
    rng = random.Random(seed)
    backlog = Backlog(poison_attempts=1_000)  # no poison here: every event is delivered
    keys = [f"r{k}" for k in range(rng.randint(1, 6))]
    total = rng.randint(1, 80)
    pending = [
        held(seq, run=rng.choice(keys) if rng.random() < 0.9 else None, pad=rng.choice([0, 0, 50, 300]))
        for seq in range(total)
    ]
    added_bytes = 0
    lanes: list[list[Held]] = []
    on_wire: dict[int, Held] = {}
    delivered: list[Held] = []
    now = 0.0
    for _ in range(10_000):
        if not pending and not backlog:
            break
        now += 0.01
        move = rng.random()
        if pending and move < 0.3:
            cut = rng.randint(1, len(pending))
            backlog.add(pending[:cut])
            added_bytes += sum(item.size for item in pending[:cut])
            del pending[:cut]
        elif move < 0.6:
            most_bytes = rng.choice([1 << 20, 400, 100])
            lane = backlog.take_lane(now, rng.randint(1, 5), most_bytes, fair=rng.random() < 0.2)
            assert len(lane) <= 1 or sum(item.size for item in lane) <= most_bytes
            assert not any(item.seq in on_wire for item in lane)
            wire_keys = {key_of(item) for other in lanes for item in other}
            assert not wire_keys & {key_of(item) for item in lane}  # a key in one lane at a time
            if lane:
                lanes.append(lane)
                on_wire.update((item.seq, item) for item in lane)
        elif lanes:
            lane = lanes.pop(rng.randrange(len(lanes)))
            for item in lane:
                del on_wire[item.seq]
            answer = rng.choice(["delivered", "delivered", "down", "whole", "deferred", "part", "lost"])
            if answer == "lost":
                backlog.release(lane, now)
                _check_places(backlog, on_wire)
                continue
            if answer == "part":  # each key: a first few delivered, the rest deferred (in order)
                cut = {key: rng.randint(0, 3) for key in map(key_of, lane)}
                outcomes, counted = [], dict.fromkeys(cut, 0)
                for item in lane:
                    key = key_of(item)
                    outcomes.append(DELIVERED if counted[key] < cut[key] else Outcome.deferred())
                    counted[key] += 1
            else:
                one = {"delivered": DELIVERED, "down": DOWN, "whole": WHOLE, "deferred": Outcome.deferred()}
                outcomes = [one[answer]] * len(lane)
            delivered += backlog.settle(lane, outcomes, now, no_wait).delivered
        _check_places(backlog, on_wire)
        assert backlog.bytes == added_bytes - sum(item.size for item in delivered)
    assert not pending
    assert not backlog
    assert sorted(item.seq for item in delivered) == list(range(total))
    by_key: dict[object, list[int]] = {}
    for item in delivered:
        by_key.setdefault(key_of(item), []).append(item.seq)
    assert all(seqs == sorted(seqs) for seqs in by_key.values())


def test_taking_a_lane_and_settling_it_pause_between_keys():
    """The loops whose length is a batch's (a lane taken from fresh groups or from FIFOs; a
    lane settled delivered whole) call the store's ``pause`` every 32 keys at least: the sidecar
    hands the GIL over there once its slice has lasted its budget, where a batch of 1,000
    events went through each loop with the GIL held for hundreds of microseconds (#37)."""
    backlog = Backlog(poison_attempts=5)
    pauses = []
    backlog.keys.pause = lambda: pauses.append(len(backlog.keys.states))
    backlog.add([held(seq, run=f"r{seq // 2}") for seq in range(1_000)])  # 500 keys
    lane = backlog.take_lane(0.0, most_events=1_000, most_bytes=1 << 30)
    assert len(lane) == 1_000
    assert len(pauses) >= 500 // 32
    pauses.clear()
    backlog.settle(lane, [DELIVERED] * 1_000, 0.1, no_wait)
    assert len(pauses) >= 500 // 32
    assert not backlog
    # Keys with FIFOs (their events held behind a refusal): taken and settled key by key too.
    backlog.add([held(seq, run=f"r{seq // 2}") for seq in range(1_000, 1_200)])  # 100 keys
    first = backlog.take_lane(0.0, most_events=1_000, most_bytes=1 << 30)
    backlog.settle(first, [DOWN] * 200, 0.2, no_wait)
    pauses.clear()
    again = backlog.take_lane(0.3, most_events=1_000, most_bytes=1 << 30)
    assert len(again) == 200
    assert len(pauses) >= 100
    pauses.clear()
    backlog.settle(again, [DELIVERED] * 200, 0.4, no_wait)
    assert len(pauses) >= 100
    assert not backlog
