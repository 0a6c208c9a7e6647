"""The backlog's store: the events the worker holds, by order key, and how a lane takes them.

Order by construction, as aiokafka mutes a partition while one of its batches is in flight: a
key whose events are in a lane is muted until that lane's answer is settled, and a lane takes a
key's events from its front, so a run's later events can never overtake its earlier ones
(through retries, splits, isolation and any number of lanes), and no list is ever scanned.

Two places hold a key's events, and a key's events are in one of them at a time:

* **fresh**: events of keys with nothing else held (no event on the wire, none refused), in
  groups of one key from one :meth:`Keys.add`, in the order they came.  A lane takes a group
  whole and marks its key as on the wire in that lane (a :class:`Wire`, no per-key object);
  the common case, a run's START and COMPLETE taken, sent and delivered together, costs a dict
  entry per run and nothing else (a lane of fresh groups alone keeps the keys it marked, and
  is settled by them when delivered whole: per key, not per event).
* **a key's FIFO** (a :class:`KeyState`): once a key has events held back (behind its events on the
  wire, or refused and waiting out a backoff, or isolated), every later event of it joins its
  FIFO, and it goes from a heap of keys that may go, by its head's sequence number.

An event of a fresh group whose key got a FIFO or went on the wire since (a lane cut it, or
another lane took its earlier group) is moved to the key's FIFO when a lane or a look reaches
it: the FIFO's events are all older, so the order holds.

Pure: time is passed in, and nothing here touches the buffer, the transport or the loop.
"""

from __future__ import annotations

import heapq
import operator
from collections import deque
from collections.abc import Callable, Sequence

from ._held import Held, Key, order_key

__all__ = ["KeyState", "Keys", "Wire"]

_INF = float("inf")
_SIZE = operator.itemgetter(2)  # Held.size


class KeyState:
    """One key's events held back, and what they go through."""

    __slots__ = ("alone", "fifo", "muted", "ready_at", "refusals", "suspect")

    def __init__(self, muted: bool = False) -> None:
        self.fifo: deque[Held] = deque()
        self.muted = muted  # its events are in a lane, on the wire
        self.ready_at = 0.0  # a retry's backoff: not before then
        self.suspect = False  # refused as part of a lane of several keys: travels with suspects only
        self.alone = False  # its head travels alone
        self.refusals = 0  # refusals of the head in a row, for its backoff

    def new_head(self) -> None:
        self.refusals, self.alone = 0, False

    def fill_lane(self, lane: list[Held], size: int, most_events: int, most_bytes: int) -> int:
        """Add the front of this key's FIFO to ``lane`` (its head alone if it travels alone),
        within the limits (at least one event in the lane), and mute the key if any went.
        Returns the lane's bytes."""
        taken = 0
        for item in self.fifo:
            if lane and (len(lane) >= most_events or size + item.size > most_bytes):
                break
            lane.append(item)
            size += item.size
            taken += 1
            if self.alone:
                break
        if taken:
            self.muted = True
        return size


class Wire:
    """A fresh key on the wire, in the lane this mark was made for (nothing else held of it)."""

    __slots__ = ()
    muted = True


class Keys:
    """Held events by key: adding them, and taking lanes of them."""

    def __init__(self) -> None:
        self.states: dict[Key, KeyState | Wire] = {}
        self._fresh: deque[list[Held]] = deque()
        # The largest event in a fresh group (or once was, since the groups were last all
        # taken): while a lane of that many times it fits in a lane's bytes, a lane takes
        # groups by their count alone.
        self._largest = 0
        # Keys that may go, by their head's sequence number (lazily pruned: an entry whose key
        # changed since is skipped), and keys waiting out a backoff, by when they may go.
        self._sendable: list[tuple[int, Key]] = []
        self._waiting: list[tuple[float, int, Key]] = []
        # Every FIFO's head, for the oldest event held (lazily pruned).
        self.heads: list[tuple[int, Key]] = []
        # The lanes on the wire, by their first sequence number.
        self._wire: dict[int, list[Held]] = {}
        # Of those, the lanes taken from fresh groups alone: their mark, the keys they marked
        # and their bytes (what settling one delivered whole needs: per key, not per event).
        self._fresh_lanes: dict[int, tuple[Wire, list[Key], int]] = {}
        #: Events and bytes held (in lanes or not).
        self.items = 0
        self.bytes = 0
        #: Events in lanes on the wire.
        self.in_lanes = 0
        #: Events of keys that wait out a backoff (not muted).
        self.resting = 0
        # Keys whose head was refused (and not settled since).
        self.refused: set[Key] = set()
        #: Suspect keys travel at most this many per lane (None: no suspects).
        self.split_to: int | None = None
        self.suspects = 0
        #: Called between two keys (every 32 in the common loops) of the loops whose length is a
        #: batch's (taking a lane, settling one delivered whole): the sidecar hands the GIL over
        #: there once its slice has lasted its budget (``Slicer.checkpoint``).  It must not
        #: touch the keys.
        self.pause: Callable[[], None] = _nothing

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
        for key in self.refused:
            state = self.states.get(key)
            if state.__class__ is KeyState and not state.muted and state.ready_at == 0.0:
                refused += len(state.fifo)
        return self.ready - refused

    @property
    def ready(self) -> int:
        """Events held that may go in a lane now or soon (not in a lane, not waiting out a
        backoff): the work the lanes have before them."""
        return self.items - self.in_lanes - self.resting

    # -- in --------------------------------------------------------------------------------

    def add(self, items: Sequence[Held]) -> None:
        """New events, in the order they were emitted, in fresh groups (one per key).  A key
        with events held goes on holding them: its groups go to its FIFO when they reach the
        front of the fresh ones, never before (older events of the key may be in a group ahead)."""
        groups: dict[Key, list[Held]] = {}
        get = groups.get
        for item in items:
            key = order_key(item.event, item.seq)
            group = get(key)
            if group is None:
                groups[key] = [item]
            else:
                group.append(item)
        if not items:
            return
        self.items += len(items)
        self.bytes += sum(map(_SIZE, items))
        largest = max(map(_SIZE, items))
        self._largest = max(largest, self._largest) if self._fresh else largest
        self._fresh.extend(groups.values())

    def _hold(self, key: Key, items: Sequence[Held]) -> KeyState:
        """Later events of a key that has events held or on the wire: to the back of its FIFO."""
        state = self.states[key]
        if state.__class__ is Wire:
            state = self.states[key] = KeyState(muted=True)
        assert isinstance(state, KeyState)
        fifo = state.fifo
        if not fifo:
            heapq.heappush(self.heads, (items[0].seq, key))
        elif state.ready_at > 0.0 and not state.muted:
            self.resting += len(items)  # its head waits out a backoff, and these with it
        fifo.extend(items)
        return state

    def make_ready(self, key: Key, state: KeyState, seq: int) -> None:
        if state.ready_at > 0.0:
            self.resting += len(state.fifo)
            heapq.heappush(self._waiting, (state.ready_at, seq, key))
        else:
            heapq.heappush(self._sendable, (seq, key))

    # -- out -------------------------------------------------------------------------------

    def _valid(self, key: Key, seq: int) -> KeyState | None:
        state = self.states.get(key)
        if state is None or state.muted or not state.fifo or state.fifo[0].seq != seq:  # type: ignore[union-attr]
            return None
        return state  # type: ignore[return-value]

    def promote(self, now: float) -> None:
        """Keys whose backoff is over may go again (what :attr:`ready` counts)."""
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
        self.promote(now)
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
        self.promote(now)
        return self._top() is not None or self._front(None) is not None

    def _top(self) -> tuple[int, Key, KeyState] | None:
        """The FIFO key that may go first (its head's sequence number, the key, its state)."""
        sendable = self._sendable
        while sendable:
            seq, key = sendable[0]
            state = self._valid(key, seq)
            if state is not None and not state.ready_at:
                return seq, key, state
            heapq.heappop(sendable)  # stale, or waiting out a backoff (in the waiting heap)
        return None

    def _front(self, mark: Wire | None) -> tuple[list[Held], Key] | None:
        """The first fresh group a lane (marked ``mark``) may take, with its key; groups of
        keys held back or on another lane's wire before it go to their keys' FIFOs."""
        fresh, keys = self._fresh, self.states
        while fresh:
            group = fresh[0]
            first = group[0]
            key = order_key(first.event, first.seq)
            state = keys.get(key)
            if state is None or state is mark:
                return group, key
            fresh.popleft()
            self._hold(key, group)
        return None

    def take_lane(self, now: float, most_events: int, most_bytes: int, *, fair: bool = False) -> list[Held]:
        """A lane's events: the keys that may go, oldest head first, each with its front (its
        head alone if it travels alone), within ``most_events`` and ``most_bytes`` (at least
        one event).  Suspects travel with suspects only, at most ``split_to`` keys a lane.
        ``fair`` (while the backend fails, one lane at a time): the key refused the fewest
        times goes first, so that a refused event cannot keep whether the backend takes others
        hidden by being tried again and again.  Its keys are muted until settled.  Empty:
        nothing may go now."""
        self.promote(now)
        mark = Wire()
        if not fair and self._top() is None:
            # No key with a FIFO may go (the common case): fresh groups only, and none can
            # become sendable while this lane is filled.
            marked: list[Key] = []
            only_fresh, size = self._take_fresh(mark, marked, most_events, most_bytes)
            if only_fresh:
                self._fresh_lanes[self._lane(only_fresh)[0].seq] = (mark, marked, size)
            return only_fresh
        lane: list[Held] = []
        size = keys = 0
        suspects: bool | None = None
        fresh_first = False
        if fair:
            fresh_first, size, suspects, keys = self._fair_start(lane, mark, most_events, most_bytes)
            if lane and suspects is None:
                return self._lane(lane)  # the fairest key alone fills the lane
        while True:
            self.pause()
            top = self._top()
            front = self._front(mark)
            if front is not None and (fresh_first or top is None or front[0][0].seq < top[0]):
                if suspects:
                    break  # suspects travel with suspects only
                suspects = False
                group, key = front
                taken, size = self._take_group(group, key, lane, size, mark, most_events, most_bytes)
                if not taken:
                    break
                if taken < len(group):
                    break  # the group was cut: the lane is full
                continue
            if top is None:
                break
            _, key, state = top
            if suspects is None:
                suspects = state.suspect
            elif state.suspect != suspects:
                break  # the next lane
            if suspects and self.split_to is not None and keys >= self.split_to:
                break
            before = len(lane)
            size = state.fill_lane(lane, size, most_events, most_bytes)
            taken = len(lane) - before
            if not taken:
                break  # the lane is full
            heapq.heappop(self._sendable)
            keys += 1
            if taken < len(state.fifo) and not state.alone:
                break  # the key was cut: the lane is full
        return self._lane(lane)

    def _take_fresh(
        self, mark: Wire, marked: list[Key], most_events: int, most_bytes: int
    ) -> tuple[list[Held], int]:
        """:meth:`take_lane` from fresh groups alone, in one loop (a group that fits whole
        goes in at once).  The keys it marks as on the wire go to ``marked``.  Returns the
        lane (not yet sorted) and its bytes."""
        fresh, keys = self._fresh, self.states
        lane: list[Held] = []
        # As many events as surely fit (each weighs at most the largest): groups are taken by
        # their count alone up to there; then by their bytes too.
        sure = min(most_events, most_bytes // self._largest) if self._largest else most_events
        size = -1  # not counted yet
        pause, groups = self.pause, 0
        while fresh:
            groups += 1
            if not groups & 31:  # (each a few hundred ns: a pause per 32 is a few µs)
                pause()
            group = fresh[0]
            first = group[0]
            key = order_key(first.event, first.seq)
            state = keys.get(key)
            if state is not None and state is not mark:
                fresh.popleft()
                self._hold(key, group)
                continue
            count = len(lane) + len(group)
            if count > sure:  # near a limit: by the bytes too
                if size < 0:
                    size = sum(map(_SIZE, lane))
                nbytes = sum(map(_SIZE, group))
                if count > most_events or size + nbytes > most_bytes:
                    taken, size = self._take_group(group, key, lane, size, mark, most_events, most_bytes)
                    if taken and state is None:
                        marked.append(key)
                    break  # the group was cut, or did not fit: the lane is full
                size += nbytes
            lane += group
            fresh.popleft()
            if state is None:
                keys[key] = mark
                marked.append(key)
        if not fresh:
            self._largest = 0
        return lane, size if size >= 0 else sum(map(_SIZE, lane))

    def _fair_start(
        self, lane: list[Held], mark: Wire, most_events: int, most_bytes: int
    ) -> tuple[bool, int, bool | None, int]:
        """Fair mode: the FIFO key refused the fewest times (oldest first) into ``lane``, unless
        a fresh group (never refused) is older.  Returns (fresh first, the lane's bytes, its
        keys' suspicion (None: the key filled the lane), keys)."""
        best: tuple[int, int, KeyState] | None = None
        for seq, key in self._sendable:
            state = self._valid(key, seq)
            if state is None or state.ready_at:
                continue
            if best is None or (state.refusals, seq) < best[:2]:
                best = (state.refusals, seq, state)
        front = self._front(mark)
        if best is None or (front is not None and (0, front[0][0].seq) < best[:2]):
            return front is not None, 0, None, 0
        state = best[2]
        size = state.fill_lane(lane, 0, most_events, most_bytes)
        if len(lane) < len(state.fifo) and not state.alone:
            return False, size, None, 1
        return False, size, state.suspect, 1

    def _take_group(
        self,
        group: list[Held],
        key: Key,
        lane: list[Held],
        size: int,
        mark: Wire,
        most_events: int,
        most_bytes: int,
    ) -> tuple[int, int]:
        """A fresh group into ``lane`` (its key marked as on the wire there), as much of it as
        fits; the rest to the key's FIFO, muted behind it.  Returns how many it took, and the
        lane's bytes."""
        taken = 0
        for item in group:
            if lane and (len(lane) >= most_events or size + item.size > most_bytes):
                break
            lane.append(item)
            size += item.size
            taken += 1
        if taken:
            self._fresh.popleft()
            if self.states.get(key) is None:
                self.states[key] = mark
            if taken < len(group):
                self._hold(key, group[taken:])
        return taken, size

    def _lane(self, lane: list[Held]) -> list[Held]:
        if lane:
            self.in_lanes += len(lane)
            if len(lane) > 1:
                self.pause()  # (a lane of a thousand events sorts in tens of µs)
                lane.sort()  # by sequence number: the order they were emitted in
            self._wire[lane[0].seq] = lane
        return lane

    # -- answers ---------------------------------------------------------------------------

    def landed(self, lane: Sequence[Held]) -> tuple[Wire, list[Key], int] | None:
        """A lane is off the wire (answered, or its answer lost).  Returns, for a lane taken
        from fresh groups alone, its mark, the keys it marked and its bytes."""
        self.in_lanes -= len(lane)
        if not lane:
            return None
        first = lane[0].seq
        if self._wire.pop(first, None) is None:
            first = min(item.seq for item in lane)
            self._wire.pop(first, None)
        return self._fresh_lanes.pop(first, None)

    # -- for the conductor -----------------------------------------------------------------

    def lowest_seq(self) -> float:
        """The sequence number of the oldest event held (inf: none)."""
        lowest: float = min(self._wire) if self._wire else _INF
        if self._fresh:
            lowest = min(lowest, self._fresh[0][0].seq)
        heads = self.heads
        while heads:
            seq, key = heads[0]
            state = self.states.get(key)
            if state.__class__ is KeyState and state.fifo and state.fifo[0].seq == seq:
                return min(lowest, seq)
            heapq.heappop(heads)
        return lowest

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

    def drain(self) -> list[Held]:
        """Everything held, oldest first; the store is empty afterwards."""
        held = {item.seq: item for lane in self._wire.values() for item in lane}
        for group in self._fresh:
            held.update((item.seq, item) for item in group)
        for state in self.states.values():
            if isinstance(state, KeyState):
                held.update((item.seq, item) for item in state.fifo)
        for store in (self.states, self._fresh, self._sendable, self._waiting, self.heads, self._wire):
            store.clear()
        self._fresh_lanes.clear()
        self.items = self.bytes = self.in_lanes = self.suspects = self.resting = 0
        self.split_to = None
        self.refused.clear()
        return [held[seq] for seq in sorted(held)]


def _nothing() -> None:
    pass
