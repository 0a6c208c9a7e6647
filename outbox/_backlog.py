"""The backlog: what the worker holds (serialized events not yet settled), one FIFO per order key,
and what a refused event's key goes through until it is delivered or settled as poison.

Order by construction, as aiokafka mutes a partition while one of its batches is in flight: a
key whose events are in a lane is muted until that lane's answer is settled, and a lane takes a
key's events from the front of its FIFO, so a run's later events can never overtake its earlier
ones (through retries, splits, isolation and any number of lanes), and no list is ever scanned
to find out.  A key that waits (a retry's backoff) holds back only itself.

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
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ._held import Held, Key, order_key
from ._ledger import Ledger
from .transports._base import About, Outcome, OutcomeKind

__all__ = ["Backlog", "Settled"]

_INF = float("inf")


class _Key:
    """One key's events and what they go through."""

    __slots__ = ("alone", "fifo", "muted", "ready_at", "refusals", "suspect")

    def __init__(self) -> None:
        self.fifo: deque[Held] = deque()
        self.muted = False  # its events are in a lane, on the wire
        self.ready_at = 0.0  # a retry's backoff: not before then
        self.suspect = False  # refused as part of a lane of several keys: travels with suspects only
        self.alone = False  # its head travels alone
        self.refusals = 0  # refusals of the head in a row, for its backoff

    def new_head(self) -> None:
        self.refusals, self.alone = 0, False


class Settled(NamedTuple):
    """What settling a lane changed: events the backend took or refused for good, and
    events settled as poison (with the outcome that was the last straw)."""

    delivered: list[Held]
    rejected: list[tuple[Held, Outcome]]
    poison: list[tuple[Held, Outcome]]


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
    """Held events by key.

    Args:
        poison_attempts: answers about an event alone that settle it as poison (given that the
            backend took others meanwhile).
    """

    def __init__(self, poison_attempts: int) -> None:
        self.poison_attempts = poison_attempts
        self._keys: dict[Key, _Key] = {}
        # Keys that may go, by their head's sequence number (lazily pruned: an entry whose key
        # changed since is skipped), and keys waiting out a backoff, by when they may go.
        self._sendable: list[tuple[int, Key]] = []
        self._waiting: list[tuple[float, int, Key]] = []
        # Every key's head, for the oldest event held (lazily pruned).
        self._heads: list[tuple[int, Key]] = []
        #: Events and bytes held (in lanes or not).
        self.items = 0
        self.bytes = 0
        #: Events in lanes on the wire.
        self.in_lanes = 0
        #: Events of keys that wait out a backoff (not muted).
        self.resting = 0
        # Keys whose head was refused (and not settled since).
        self._refused_keys: set[Key] = set()
        #: Suspect keys travel at most this many per lane (None: no suspects).
        self.split_to: int | None = None
        self._suspects = 0
        #: The evidence for poison, per event.
        self.ledger = Ledger(poison_attempts)

    def __len__(self) -> int:
        return self.items

    @property
    def waiting(self) -> int:
        """Events held and not in a lane."""
        return self.items - self.in_lanes

    @property
    def fresh(self) -> int:
        """Events that may go now or soon of keys never refused: the new work before the
        lanes (refused keys wait for their own reasons)."""
        refused = 0
        for key in self._refused_keys:
            state = self._keys.get(key)
            if state is not None and not state.muted and state.ready_at == 0.0:
                refused += len(state.fifo)
        return self.ready - refused

    @property
    def ready(self) -> int:
        """Events held that may go in a lane now or soon (not in a lane, not waiting out a
        backoff): the work the lanes have before them."""
        return self.items - self.in_lanes - self.resting

    # -- in --------------------------------------------------------------------------------

    def add(self, items: Iterable[Held]) -> None:
        """New events, in the order they were emitted: each joins its key's FIFO."""
        keys, heads, sendable, push = self._keys, self._heads, self._sendable, heapq.heappush
        count = nbytes = 0
        for item in items:
            event = item.event
            key = event.run_id or event.key or item.seq  # order_key, inlined: once per event
            count += 1
            nbytes += item.size
            state = keys.get(key)
            if state is None:  # a new key (most are): its event is its head, and may go
                state = keys[key] = _Key()
                state.fifo.append(item)
                push(heads, (item.seq, key))
                push(sendable, (item.seq, key))
                continue
            fifo = state.fifo
            fifo.append(item)
            if state.ready_at > 0.0 and not state.muted:
                self.resting += 1
            if len(fifo) == 1:
                push(heads, (item.seq, key))
                if not state.muted:
                    self._ready(key, state, item.seq)
        self.items += count
        self.bytes += nbytes

    def _ready(self, key: Key, state: _Key, seq: int) -> None:
        if state.ready_at > 0.0:
            self.resting += len(state.fifo)
            heapq.heappush(self._waiting, (state.ready_at, seq, key))
        else:
            heapq.heappush(self._sendable, (seq, key))

    # -- out -------------------------------------------------------------------------------

    def _valid(self, key: Key, seq: int) -> _Key | None:
        state = self._keys.get(key)
        if state is None or state.muted or not state.fifo or state.fifo[0].seq != seq:
            return None
        return state

    def promote(self, now: float) -> None:
        """Keys whose backoff is over may go again (what :attr:`ready` counts)."""
        self._promote(now)

    def _promote(self, now: float) -> None:
        waiting = self._waiting
        while waiting and waiting[0][0] <= now:
            ready_at, seq, key = heapq.heappop(waiting)
            state = self._valid(key, seq)
            if state is not None and state.ready_at == ready_at:
                state.ready_at = 0.0
                self.resting -= len(state.fifo)
                heapq.heappush(self._sendable, (seq, key))

    def next_ready_at(self, now: float) -> float | None:
        """When a key that waits out a backoff may go next (None: none waits)."""
        self._promote(now)
        waiting = self._waiting
        while waiting:
            ready_at, seq, key = waiting[0]
            state = self._valid(key, seq)
            if state is not None and state.ready_at == ready_at:
                return ready_at
            heapq.heappop(waiting)
        return None

    def can_send(self, now: float) -> bool:
        """Whether a lane could take a key now (one not muted, not waiting out a backoff).
        :attr:`ready` also counts the later events of keys on the wire, which cannot go."""
        self._promote(now)
        sendable = self._sendable
        while sendable:
            seq, key = sendable[0]
            state = self._valid(key, seq)
            if state is not None and not state.ready_at:
                return True
            heapq.heappop(sendable)
        return False

    def take_lane(self, now: float, most_events: int, most_bytes: int, *, fair: bool = False) -> list[Held]:
        """A lane's events: the keys that may go, oldest head first, each with the front of
        its FIFO (its head alone if it travels alone), within ``most_events`` and
        ``most_bytes`` (at least one event).  Suspects travel with suspects only, at most
        ``split_to`` keys a lane.  ``fair`` (while the backend fails, one lane at a time): the
        key refused the fewest times goes first, so that a refused event cannot keep whether
        the backend takes others hidden by being tried again and again.  Its keys are muted
        until :meth:`settle`.  Empty: nothing may go now."""
        self._promote(now)
        sendable = self._sendable
        lane: list[Held] = []
        size = 0
        suspects: bool | None = None
        keys = 0
        if fair:
            best: tuple[int, int, Key, _Key] | None = None
            for seq, key in sendable:
                state = self._valid(key, seq)
                if (
                    state is not None
                    and not state.ready_at
                    and (best is None or (state.refusals, seq) < best[:2])
                ):
                    best = (state.refusals, seq, key, state)
            if best is not None:
                state = best[3]
                size = self._fill(state, lane, 0, most_events, most_bytes)
                suspects, keys = state.suspect, 1
                if len(lane) < len(state.fifo) and not state.alone:
                    return self._lane(lane)  # the key alone fills the lane
        while sendable:
            seq, key = sendable[0]
            state = self._valid(key, seq)
            if state is None:
                heapq.heappop(sendable)
                continue
            if state.ready_at:
                heapq.heappop(sendable)  # stale: it waits out a backoff (and is in the waiting heap)
                continue
            if suspects is None:
                suspects = state.suspect
            elif state.suspect != suspects:
                break  # the next lane
            if suspects and self.split_to is not None and keys >= self.split_to:
                break
            before = len(lane)
            size = self._fill(state, lane, size, most_events, most_bytes)
            taken = len(lane) - before
            if not taken:
                break  # the lane is full
            heapq.heappop(sendable)
            keys += 1
            if taken < len(state.fifo) and not state.alone:
                break  # the key was cut: the lane is full
        return self._lane(lane)

    @staticmethod
    def _fill(state: _Key, lane: list[Held], size: int, most_events: int, most_bytes: int) -> int:
        """Add the front of ``state``'s FIFO to ``lane`` (its head alone if it travels alone),
        within the limits (at least one event in the lane), and mute it if any went.  Returns
        the lane's bytes."""
        taken = 0
        for item in state.fifo:
            if lane and (len(lane) >= most_events or size + item.size > most_bytes):
                break
            lane.append(item)
            size += item.size
            taken += 1
            if state.alone:
                break
        if taken:
            state.muted = True
        return size

    def _lane(self, lane: list[Held]) -> list[Held]:
        self.in_lanes += len(lane)
        if len(lane) > 1:
            lane.sort()  # by sequence number: the order they were emitted in
        return lane

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
        if all(o.kind is OutcomeKind.DELIVERED for o in outcomes) and len(outcomes) == len(lane):
            return self._delivered(lane, now)
        self.in_lanes -= len(lane)
        answer = _Answer.of(outcomes, now, delay)
        if answer.any_delivered:
            self.ledger.took(now)
        by_key: dict[Key, list[tuple[Held, Outcome]]] = {}
        for item, outcome in zip(lane, outcomes, strict=True):
            by_key.setdefault(order_key(item), []).append((item, outcome))
        answer.keys = len(by_key)
        for key, pairs in by_key.items():
            self._settle_key(key, pairs, answer)
        if answer.whole and answer.keys > 1:
            self.split_to = max(1, min(self.split_to or answer.keys, answer.keys) // 2)
        elif answer.was_suspects and answer.any_delivered and self.split_to is not None:
            self.split_to *= 2
        if not self._suspects:
            self.split_to = None
        return Settled(answer.delivered, answer.rejected, answer.poison)

    def _settle_key(self, key: Key, pairs: list[tuple[Held, Outcome]], answer: _Answer) -> None:
        """One key's part of an answer: its settled events leave its FIFO; a refused head
        waits (a backoff of its own, or the answer's shared one) or is settled as poison."""
        state = self._keys[key]
        state.muted = False
        answer.was_suspects = answer.was_suspects or state.suspect
        fifo = state.fifo
        head = fifo[0]
        retry = self._take_settled(state, pairs, answer)
        new_head = bool(fifo) and fifo[0] is not head
        if new_head:
            state.new_head()
            self._refused_keys.discard(key)
        now = answer.now
        if retry is None:
            # Settled, or deferred by the transport (not a failure): again at once, after a
            # pause if nothing at all moved (a transport that only defers must not spin).
            state.ready_at = 0.0 if answer.moved else now + answer.delay(0, None, False)
        elif retry[1].about is not About.BACKEND:
            self._refused(key, state, pairs, retry, answer)
        else:
            state.refusals += 1
            self._refused_keys.add(key)
            state.ready_at = now + answer.delay(state.refusals, retry[1].retry_after, False)
        if fifo:
            if state.ready_at <= now:
                state.ready_at = 0.0
            if new_head or fifo[0] is not head:
                heapq.heappush(self._heads, (fifo[0].seq, key))
            self._ready(key, state, fifo[0].seq)
        else:
            if state.suspect:
                self._suspects -= 1
            del self._keys[key]
            self._refused_keys.discard(key)

    def _take_settled(
        self, state: _Key, pairs: list[tuple[Held, Outcome]], answer: _Answer
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
                self.items -= 1
                self.bytes -= item.size
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
            self._suspects -= 1
        return retry

    def _delivered(self, lane: Sequence[Held], now: float) -> Settled:
        """:meth:`settle` for a lane the backend took whole (the common case, in one pass)."""
        self.in_lanes -= len(lane)
        self.items -= len(lane)
        self.ledger.took(now)
        keys, touched = self._keys, dict[Key, _Key]()
        nbytes = 0
        for item in lane:
            event = item.event
            key = event.run_id or event.key or item.seq  # order_key, inlined: once per event
            state = touched.get(key)
            if state is None:
                state = touched[key] = keys[key]
            fifo = state.fifo
            if fifo[0] is item:
                fifo.popleft()
            else:  # out of order (against the contract): settled all the same
                fifo.remove(item)
            nbytes += item.size
        self.bytes -= nbytes
        if self.ledger:
            for item in lane:
                self.ledger.forget(item.seq)
        was_suspects = False
        for key, state in touched.items():
            state.muted = False
            if state.suspect:
                was_suspects, state.suspect = True, False
                self._suspects -= 1
            self._refused_keys.discard(key)
            fifo = state.fifo
            if fifo:  # its head went: the next one is new, and may go at once
                state.new_head()
                state.ready_at = 0.0
                heapq.heappush(self._heads, (fifo[0].seq, key))
                self._ready(key, state, fifo[0].seq)
            else:
                del keys[key]
        if was_suspects and self.split_to is not None:
            self.split_to *= 2
        if not self._suspects:
            self.split_to = None
        return Settled(list(lane), [], [])

    def _refused(
        self,
        key: Key,
        state: _Key,
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
            self.items -= 1
            self.bytes -= item.size
            self.ledger.forget(seq)
            answer.poison.append((item, outcome))
            state.new_head()
            self._refused_keys.discard(key)
            state.ready_at = 0.0
            return
        if answer.whole and answer.keys > 1 and not state.suspect:
            state.suspect = True
            self._suspects += 1
        elif answer.whole and answer.keys == 1 and len(pairs) > 1:
            # One key's events refused as a whole (too large together for a Kafka topic, say):
            # its head goes alone, in order, and the rest follows it.
            state.alone = True
        state.refusals += 1
        self._refused_keys.add(key)
        state.ready_at = answer.now + answer.event_delay()

    def taken_since_refused(self, item: Held) -> bool:
        """Whether the backend took other events since ``item`` was first refused (about
        itself): the evidence that tells a poison event from a backend that is down."""
        return self.ledger.taken_since_refused(item.seq)

    # -- for the conductor -----------------------------------------------------------------

    def lowest_seq(self) -> float:
        """The sequence number of the oldest event held (inf: none)."""
        heads = self._heads
        while heads:
            seq, key = heads[0]
            state = self._keys.get(key)
            if state is not None and state.fifo and state.fifo[0].seq == seq:
                return seq
            heapq.heappop(heads)
        return _INF

    def pull_forward(self) -> None:
        """Every key that waits out a backoff may go at once (a close began: one last attempt
        for all, then attempts paced within its deadline)."""
        for ready_at, seq, key in self._waiting:
            state = self._valid(key, seq)
            if state is not None and state.ready_at == ready_at:
                state.ready_at = 0.0
                self.resting -= len(state.fifo)
                heapq.heappush(self._sendable, (seq, key))
        self._waiting.clear()

    def release(self, lane: Sequence[Held], now: float) -> None:
        """A lane whose answer is lost (our own error): its keys go again as they are."""
        self.in_lanes -= len(lane)
        for key in dict.fromkeys(order_key(item) for item in lane):
            state = self._keys.get(key)
            if state is not None and state.muted:
                state.muted = False
                if state.fifo:
                    self._ready(key, state, state.fifo[0].seq)

    def drain(self) -> list[Held]:
        """Everything held, oldest first; the backlog is empty afterwards."""
        held = sorted(item for state in self._keys.values() for item in state.fifo)
        self._keys.clear()
        self._sendable.clear()
        self._waiting.clear()
        self._heads.clear()
        self.items = self.bytes = self.in_lanes = self._suspects = self.resting = 0
        self.split_to = None
        self.ledger.clear()
        self._refused_keys.clear()
        return held
