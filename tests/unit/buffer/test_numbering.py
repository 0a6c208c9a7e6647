"""The buffer's sequence numbers (``outbox/_numbering.py``): every accepted event gets the next
one and none is given twice, through takes, sheds of the newest, untakes, clears and events
retired beyond the queue.  Checked against a model that stores each queued event's number."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from outbox._buffer._numbering import Journal, Numbering

OPS = st.lists(
    st.tuples(st.sampled_from(["queue", "take", "shed", "untake", "clear", "retire"]), st.integers(1, 6)),
    max_size=120,
)


@settings(max_examples=300)
@given(OPS)
def test_numbers_are_never_given_twice_and_always_found(ops):
    numbers = Numbering()
    queue: list[int] = []  # the model: each queued event's number
    given_out: set[int] = set()
    next_number = 0
    last_taken: list[int] = []
    for op, k in ops:
        if op == "queue":
            for _ in range(k):
                assert numbers.end(len(queue)) == next_number
                assert next_number not in given_out
                given_out.add(next_number)
                queue.append(next_number)
                next_number += 1
            last_taken = []
        elif op == "take" and queue:
            k = min(k, len(queue))
            assert list(numbers.advance(k)) == queue[:k]
            last_taken, queue = queue[:k], queue[k:]
        elif op == "shed" and queue:
            assert numbers.retire_tail(len(queue)) == queue.pop()
            last_taken = []
        elif op == "untake" and last_taken:
            back = last_taken[-min(k, len(last_taken)) :]
            numbers.restore(back)
            queue = back + queue
            last_taken = []
        elif op == "clear":
            numbers.clear(len(queue), k)  # k events beyond the queue go too
            next_number += k
            given_out.update(range(next_number - k, next_number))
            queue, last_taken = [], []
        elif op == "retire":
            assert numbers.retire_next(len(queue), k) == next_number
            next_number += k
            given_out.update(range(next_number - k, next_number))
            last_taken = []
        for index, seq in enumerate(queue):
            assert numbers.seq_at(index) == seq
            assert numbers.index_of(seq, len(queue)) == index
        for probe in range(max(0, next_number - 12), next_number + 2):
            want = next((i for i, seq in enumerate(queue) if seq >= probe), len(queue))
            assert numbers.index_from(probe, len(queue)) == want
        if queue:
            assert numbers.head == queue[0]
        assert numbers.end(len(queue)) == next_number


def test_a_journal_merges_neighbours_of_one_outcome():
    journal = Journal()
    journal.note(0, 1, "delivered")
    journal.note(1, 3, "delivered")
    journal.note(3, 4, "dropped_full")
    journal.note(7, 8, "dropped_full")
    assert journal.take() == [[0, 3, "delivered"], [3, 4, "dropped_full"], [7, 8, "dropped_full"]]
    assert journal.take() == []
