"""The backlog: what the worker holds (serialized events not yet settled), by order key (the
store and the taking of lanes are :mod:`._keys`), and what an answer does to it: what a refused
event's key goes through until it is delivered or settled as poison.  A key that waits (a
retry's backoff) holds back only itself.

Isolating an event the backend cannot take (a poison suspect: a RETRY about the event):

* a lane of several keys refused as a whole marks its keys suspect; suspects travel in lanes of
  their own, of at most ``split_to`` keys, which halves at each such refusal and doubles back
  when a suspects' lane goes through (a bisection over keys);
* a key refused alone, with several events, while the backend takes others, sends its head
  alone until that is delivered;
* an event refused ``poison_attempts`` times when the answer was about it alone (sent alone, or
  refused while the backend took others of the same request), and while the backend took
  other events since it first failed, is settled as ``poison`` and its key goes on.  A backend
  that takes nothing at all is down, not poisoned: nothing is settled then.

Pure: time is passed in, and nothing here touches the buffer, the transport or the loop.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ..transports._base import DELIVERED, About, Outcome, OutcomeKind
from ._held import Held, Key, order_key
from ._keys import Keys, KeyState, Wire
from ._ledger import Ledger

__all__ = ["Backlog", "Settled"]


class Settled(NamedTuple):
    """What settling a lane changed: events the backend took or refused for good, and
    events settled as poison (with the outcome that was the last straw)."""

    delivered: list[Held]
    rejected: list[tuple[Held, Outcome]]
    poison: list[tuple[Held, Outcome]]
    #: The bytes of all of them.
    size: int


@dataclass(slots=True)
class _Answer:
    """One answer being settled: what it says as a whole, and what it settled so far."""

    outcomes: Sequence[Outcome]
    now: float
    delay: Callable[[int, float | None, bool], float]
    #: The backend took some of it.
    any_delivered: bool
    #: Refused without saying which of its events is the trouble, while nothing was taken:
    #: the bisection's evidence.
    whole: bool
    #: Something was settled (taken, or refused for good).
    moved: bool
    #: How many of its events the backend judged (not deferred).
    judged: int
    keys: int = 0
    was_suspects: bool = False
    delivered: list[Held] = field(default_factory=list)
    rejected: list[tuple[Held, Outcome]] = field(default_factory=list)
    poison: list[tuple[Held, Outcome]] = field(default_factory=list)
    _event_delay: float | None = None

    @classmethod
    def of(
        cls, outcomes: Sequence[Outcome], now: float, delay: Callable[[int, float | None, bool], float]
    ) -> _Answer:
        kinds = [o.kind for o in outcomes]
        any_delivered = OutcomeKind.DELIVERED in kinds
        whole = not any_delivered and any(
            o.kind is OutcomeKind.RETRY and o.about is About.REQUEST for o in outcomes
        )
        moved = any_delivered or OutcomeKind.REJECTED in kinds
        judged = len(kinds) - kinds.count(OutcomeKind.DEFERRED)
        return cls(outcomes, now, delay, any_delivered, whole, moved, judged)

    def event_delay(self) -> float:
        """One wait for every key this answer refused about the events, so that the halves of
        a bisection go again together; a refused event is progress (its key is being
        isolated), not a failure that grows the backoff (a backend that takes nothing at all
        is the breaker's to pace)."""
        if self._event_delay is None:
            asked = max((o.retry_after or 0.0) for o in self.outcomes) or None
            self._event_delay = self.delay(1, asked, True)
        return self._event_delay


class Backlog:
    """Held events by key (its store, :class:`Keys`), and the answers that settle them.

    The worker adds events and takes lanes through the backlog (the store's methods, handed
    on below); settling an answer works on the store's keys, FIFOs and heads.

    Args:
        poison_attempts: answers about an event alone that settle it as poison (given that the
            backend took others meanwhile).
        keys: the store (a new one by default).
    """

    def __init__(self, poison_attempts: int, keys: Keys | None = None) -> None:
        #: The store: fresh groups, a FIFO per key held back, muting, taking lanes.
        self.keys = Keys() if keys is None else keys
        self.poison_attempts = poison_attempts
        #: The evidence for poison, per event.
        self.ledger = Ledger(poison_attempts)

    # -- the store, handed on ----------------------------------------------------------------

    def __len__(self) -> int:
        return self.keys.items

    def add(self, items: Sequence[Held]) -> None:
        self.keys.add(items)

    def take_lane(self, now: float, most_events: int, most_bytes: int, *, fair: bool = False) -> list[Held]:
        return self.keys.take_lane(now, most_events, most_bytes, fair=fair)

    def promote(self, now: float) -> None:
        self.keys.promote(now)

    def next_ready_at(self, now: float) -> float | None:
        return self.keys.next_ready_at(now)

    def can_send(self, now: float) -> bool:
        return self.keys.can_send(now)

    def lowest_seq(self) -> float:
        return self.keys.lowest_seq()

    def pull_forward(self) -> None:
        self.keys.pull_forward()

    @property
    def items(self) -> int:
        return self.keys.items

    @property
    def bytes(self) -> int:
        return self.keys.bytes

    @property
    def in_lanes(self) -> int:
        return self.keys.in_lanes

    @property
    def resting(self) -> int:
        return self.keys.resting

    @property
    def split_to(self) -> int | None:
        return self.keys.split_to

    @property
    def waiting(self) -> int:
        return self.keys.waiting

    @property
    def fresh(self) -> int:
        return self.keys.fresh

    @property
    def ready(self) -> int:
        return self.keys.ready

    # -- answers ---------------------------------------------------------------------------

    def settle(
        self,
        lane: Sequence[Held],
        outcomes: Sequence[Outcome],
        now: float,
        delay: Callable[[int, float | None, bool], float],
    ) -> Settled:
        """Apply one answer.  ``delay(refusals, retry_after, about_event)`` is how long a key
        waits before its next attempt."""
        if len(outcomes) == len(lane) and outcomes.count(DELIVERED) == len(lane):
            return self._delivered(lane, now)  # the common case (counted at C speed)
        self.keys.landed(lane)
        answer = _Answer.of(outcomes, now, delay)
        if answer.any_delivered:
            self.ledger.took(now)
        by_key: dict[Key, list[tuple[Held, Outcome]]] = {}
        for item, outcome in zip(lane, outcomes, strict=True):
            by_key.setdefault(order_key(item.event, item.seq), []).append((item, outcome))
        answer.keys = len(by_key)
        for key, pairs in by_key.items():
            self._settle_key(key, self._state_of(key, [item for item, _ in pairs]), pairs, answer)
        if answer.whole and answer.keys > 1:
            self.keys.split_to = max(1, min(self.keys.split_to or answer.keys, answer.keys) // 2)
        elif answer.was_suspects and answer.any_delivered and self.keys.split_to is not None:
            self.keys.split_to *= 2
        if not self.keys.suspects:
            self.keys.split_to = None
        size = sum(item.size for item in answer.delivered)
        size += sum(item.size for item, _ in answer.rejected) + sum(item.size for item, _ in answer.poison)
        return Settled(answer.delivered, answer.rejected, answer.poison, size)

    def _settle_key(
        self, key: Key, state: KeyState, pairs: list[tuple[Held, Outcome]], answer: _Answer
    ) -> None:
        """One key's part of an answer: its settled events leave its FIFO; a refused head
        waits (a backoff of its own, or the answer's shared one) or is settled as poison."""
        state.muted = False
        answer.was_suspects = answer.was_suspects or state.suspect
        fifo = state.fifo
        head = fifo[0]
        retry = self._take_settled(state, pairs, answer)
        new_head = bool(fifo) and fifo[0] is not head
        if new_head:
            state.new_head()
            self.keys.refused.discard(key)
        now = answer.now
        if retry is None:
            # Settled, or deferred by the transport (not a failure): again at once, after a
            # pause if nothing at all moved (a transport that only defers must not spin).
            state.ready_at = 0.0 if answer.moved else now + answer.delay(0, None, False)
        elif retry[1].about is not About.BACKEND:
            self._refused(key, state, pairs, retry, answer)
        else:
            state.refusals += 1
            self.keys.refused.add(key)
            state.ready_at = now + answer.delay(state.refusals, retry[1].retry_after, False)
        if fifo:
            if state.ready_at <= now:
                state.ready_at = 0.0
            if new_head or fifo[0] is not head:
                heapq.heappush(self.keys.heads, (fifo[0].seq, key))
            self.keys.make_ready(key, state, fifo[0].seq)
        else:
            if state.suspect:
                self.keys.suspects -= 1
            del self.keys.states[key]
            self.keys.refused.discard(key)

    def _take_settled(
        self, state: KeyState, pairs: list[tuple[Held, Outcome]], answer: _Answer
    ) -> tuple[Held, Outcome] | None:
        """Take the key's delivered and rejected events out of its FIFO; returns its first
        refused event (with its outcome), if any."""
        fifo = state.fifo
        retry: tuple[Held, Outcome] | None = None
        took = False
        for item, outcome in pairs:
            kind = outcome.kind
            if kind is OutcomeKind.DELIVERED or kind is OutcomeKind.REJECTED:
                if fifo and fifo[0] is item:
                    fifo.popleft()
                else:  # out of order (against the contract): settled all the same
                    fifo.remove(item)
                self.keys.items -= 1
                self.keys.bytes -= item.size
                if self.ledger:
                    self.ledger.forget(item.seq)
                if kind is OutcomeKind.DELIVERED:
                    answer.delivered.append(item)
                    took = True
                else:
                    answer.rejected.append((item, outcome))
            elif kind is OutcomeKind.RETRY:
                if outcome.about is not About.BACKEND:
                    self.ledger.refused(item.seq, answer.now)
                if retry is None:
                    retry = (item, outcome)
        if took and state.suspect:
            state.suspect = False
            self.keys.suspects -= 1
        return retry

    def _delivered(self, lane: Sequence[Held], now: float) -> Settled:
        """:meth:`settle` for a lane the backend took whole (the common case, in one pass): a
        fresh key (on the wire with nothing else held) is forgotten; a key with a FIFO loses
        the events it had there and goes on with the rest."""
        fresh = self.keys.landed(lane)
        self.keys.items -= len(lane)
        self.ledger.took(now)
        if self.ledger:
            for item in lane:
                self.ledger.forget(item.seq)
        keys, touched = self.keys.states, dict[Key, KeyState]()
        if fresh is not None:
            # Taken from fresh groups alone: none of its events is in a FIFO, so per key.
            mark, marked, nbytes = fresh
            pause = self.keys.pause
            for i, key in enumerate(marked):
                if not i & 31:
                    pause()
                state = keys.get(key)
                if state is mark:
                    del keys[key]
                elif isinstance(state, KeyState):  # later events of it were held back meanwhile
                    touched[key] = state
            self.keys.bytes -= nbytes
            if touched:
                self._went_on(touched)
            return Settled(list(lane), [], [], nbytes)
        nbytes = 0
        pause = self.keys.pause
        for item in lane:
            pause()
            nbytes += item.size
            key = order_key(item.event, item.seq)
            state = keys.get(key)
            if state is None:
                continue  # a fresh key's later event in this lane: forgotten already
            if state.__class__ is Wire:
                del keys[key]
                continue
            assert isinstance(state, KeyState)
            touched[key] = state
            fifo = state.fifo
            if fifo and fifo[0].seq <= item.seq:  # it went from the FIFO (not a fresh group)
                if fifo[0] is item:
                    fifo.popleft()
                else:  # out of order (against the contract): settled all the same
                    fifo.remove(item)
        self.keys.bytes -= nbytes
        if touched:
            self._went_on(touched)
        return Settled(list(lane), [], [], nbytes)

    def _went_on(self, touched: dict[Key, KeyState]) -> None:
        """Keys whose events on the wire were all delivered: unmuted, their next event a new
        head that may go at once."""
        was_suspects = False
        keys = self.keys.states
        for key, state in touched.items():
            state.muted = False
            if state.suspect:
                was_suspects, state.suspect = True, False
                self.keys.suspects -= 1
            self.keys.refused.discard(key)
            fifo = state.fifo
            if fifo:
                state.new_head()
                state.ready_at = 0.0
                heapq.heappush(self.keys.heads, (fifo[0].seq, key))
                self.keys.make_ready(key, state, fifo[0].seq)
            else:
                del keys[key]
        if was_suspects and self.keys.split_to is not None:
            self.keys.split_to *= 2
        if not self.keys.suspects:
            self.keys.split_to = None

    def _refused(
        self,
        key: Key,
        state: KeyState,
        pairs: list[tuple[Held, Outcome]],
        retry: tuple[Held, Outcome],
        answer: _Answer,
    ) -> None:
        """A key's head was refused, and the answer may be about it."""
        item, outcome = retry
        if state.fifo[0] is not item:
            return  # an earlier event of the key is still ahead (the transport kept no order)
        seq = item.seq
        # About it alone: the transport says the answer was about this very event (sent alone,
        # or named in a per-event answer), or it was the one event of its request the backend
        # judged (the others deferred).  A request refused as a whole says nothing about which
        # of its events is the trouble.  (It is the first of its key refused there: the later
        # ones wait behind it.)
        if self.ledger.judge(seq, outcome.about is About.EVENT or answer.judged == 1, answer.now):
            state.fifo.popleft()
            self.keys.items -= 1
            self.keys.bytes -= item.size
            self.ledger.forget(seq)
            answer.poison.append((item, outcome))
            state.new_head()
            self.keys.refused.discard(key)
            state.ready_at = 0.0
            return
        if answer.whole and answer.keys > 1 and not state.suspect:
            state.suspect = True
            self.keys.suspects += 1
        elif answer.whole and answer.keys == 1 and len(pairs) > 1:
            # One key's events refused as a whole (too large together for a Kafka topic, say):
            # its head goes alone, in order, and the rest follows it.
            state.alone = True
        state.refusals += 1
        self.keys.refused.add(key)
        state.ready_at = answer.now + answer.event_delay()

    def taken_since_refused(self, item: Held) -> bool:
        """Whether the backend took other events since ``item`` was first refused (about
        itself): the evidence that tells a poison event from a backend that is down."""
        return self.ledger.taken_since_refused(item.seq)

    def _state_of(self, key: Key, items: Sequence[Held]) -> KeyState:
        """Key ``key``'s state with ``items`` (its events of one lane, in order) at the front of
        its FIFO: a lane taken from a fresh group left them in no FIFO."""
        state = self.keys.states.get(key)
        if state is None or state.__class__ is Wire:
            state = self.keys.states[key] = KeyState(muted=True)
            state.fifo.extend(items)
            heapq.heappush(self.keys.heads, (items[0].seq, key))
            return state
        assert isinstance(state, KeyState)
        fifo = state.fifo
        if not fifo or fifo[0].seq > items[0].seq:
            fifo.extendleft(reversed(items))
            heapq.heappush(self.keys.heads, (items[0].seq, key))
        return state

    def release(self, lane: Sequence[Held], now: float) -> None:
        """A lane whose answer is lost (our own error): its keys go again as they are."""
        self.keys.landed(lane)
        by_key: dict[Key, list[Held]] = {}
        for item in lane:
            by_key.setdefault(order_key(item.event, item.seq), []).append(item)
        for key, items in by_key.items():
            state = self._state_of(key, items)
            if state.muted:
                state.muted = False
                self.keys.make_ready(key, state, state.fifo[0].seq)

    def drain(self) -> list[Held]:
        """Everything held, oldest first; the backlog is empty afterwards."""
        self.ledger.clear()
        return self.keys.drain()
