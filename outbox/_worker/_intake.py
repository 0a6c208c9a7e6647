"""The intake: events leave the buffer here, are serialized, and become :class:`Held` items for
the backlog.  It keeps the estimate of what object events weigh true (emit counts an object at
that estimate, never serializing it), and the byte bound with it.

Its work is per event and runs on the sidecar's thread in slices (``_runtime._slices``), so that a
handler waiting for the GIL gets it within a few tens of microseconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._buffer._buffer import UNLOOKED_MOST, Buffer, Entry, Reason, serialize_held
from .._observability._deadletter import DeadLetter
from .._observability._log import RateLimitedLog, described
from .._run._run import RunRecord
from .._run._serde import SerializedEvent, serialize
from .._runtime._slices import SLICE, Slicer
from ._held import Held

__all__ = ["Intake", "measure_here"]

_INF = float("inf")
_TEXT_TYPES = (str, bytes, bytearray)
# Held(...) without its Python-level __new__ (once per event).
_new_held = tuple.__new__
# While objects wait in the queue, the newest (at most SAMPLE_MOST of the last SAMPLE_SPAN) are
# measured every SAMPLE_INTERVAL, so that events that grow are re-priced within it.
SAMPLE_INTERVAL = 0.01
SAMPLE_MOST = 4
SAMPLE_SPAN = 64
#: Events taken from the buffer under one hold of its lock, and let go of once serialized, at a
#: time (a checkpoint between two pieces): a whole batch taken at once held the lock, and the
#: GIL, for 150-300 µs.
TAKE_PIECE = 64
# A dead letter: (reason, detail, the body if serialized, the event as given).
DeadRecord = tuple[str, str, bytes | None, Any]


def measure_here(buf: Buffer) -> None:
    """Measure the newest object held (queued, or in the spill's overflow) on the emitter's
    thread (``buf.measure_here`` is due:
    an object queued ``UNLOOKED_MOST`` events past the sidecar's last look, which it could not
    take; see ``_buffer._holdings``): serialized outside the lock, put in its place at its
    exact size, the estimate learnt from it and the byte bound enforced.  A sidecar that
    looked meanwhile makes this a no-op; an event that cannot be serialized is left for the
    sidecar to count.  Not re-entrantly (a signal handler's emit on a thread interrupted inside
    the outbox, its lock held and the accounts half-changed): the emitter that made the measure
    due makes it, once that thread goes on."""
    if buf.owned():
        return
    with buf.lock:
        if not buf.holdings.claim_measure_here_locked():
            return
        end = buf.holdings.next_seq
        picked = buf.holdings.newest_objects_locked(1, end)
        if not picked:
            buf.looked_locked(end)
            return
    serialize_in_place(buf, picked, _INF, end)


def serialize_in_place(
    buf: Buffer, picked: list[tuple[int, Any]], budget: float, end: int, sidecar: bool = False
) -> None:
    """Serialize held objects outside the buffer's lock (``picked``: sequence number and event,
    for ``budget`` seconds at most), then put each in its place at its exact size, if it is
    still held there (``Buffer.serialized_in_place_locked``).  An event that cannot be
    serialized is left as it is: taking it counts it as ``invalid_event``.  Either is a look at
    the newest objects held before number ``end`` (``Holdings.looked_locked``; an emitter's that
    serialized nothing learnt nothing, the ``sidecar``'s always counts): an emitter's measure,
    the intake's sampling (the spill's writes serialize with the same ``serialize_held``)."""
    done = [(seq, event, ser) for seq, event, ser in serialize_held(picked, budget=budget) if ser is not None]
    with buf.lock:
        if done:
            buf.serialized_in_place_locked(done)
        buf.looked_locked(end, measured=sidecar or bool(done))


class Intake:
    """Takes events from ``buffer`` for the worker.

    Args:
        max_batch_events, max_batch_bytes, linger: the batching settings.
        slicer: ends the slices of its per-event work.
        log: the worker's rate-limited log.
        dead_letter: where events dropped here (too large, unserializable) are kept, if anywhere.
        lowest_held: the sequence number of the oldest event the worker holds beyond what is
            being taken (for the buffer's flush accounting).
    """

    def __init__(
        self,
        buffer: Buffer,
        *,
        max_batch_events: int,
        max_batch_bytes: int,
        linger: float,
        slicer: Slicer,
        log: RateLimitedLog,
        dead_letter: DeadLetter | None,
        lowest_held: Callable[[], float],
    ) -> None:
        self.buffer = buffer
        self.max_batch_events = max_batch_events
        self.max_batch_bytes = max_batch_bytes
        # A batch is due at its size, or at half the buffer if that comes first: the events
        # taken stay in the buffer's bounds while on the wire, and a batch as large as the
        # buffer would leave no room for what is emitted meanwhile (a healthy backend, and
        # drops: ``max_events`` 1,000 with the default batch of 1,000).
        self.due_events = min(max_batch_events, max(1, buffer.holdings.max_events // 2))
        self.due_bytes = min(max_batch_bytes, max(1, buffer.holdings.max_bytes // 2))
        self.linger = linger
        self.slicer = slicer
        self.log = log
        self.dead_letter = dead_letter
        self.lowest_held = lowest_held
        self._linger_until = _INF
        #: The buffer's ``next_seq`` at the last look (``due``): an emitter that waits for room
        #: wakes the sidecar only if events came since (``Sidecar.wake_for_room``).
        self.seen_seq = -1
        self._sampled_at = 0.0
        self._sampled_seq = -1

    # -- when ------------------------------------------------------------------------------

    def due(self, now: float, urgent: bool) -> float:
        """Seconds until a batch is worth taking from the queue (0: now; inf: the queue is
        empty and nothing needs a look before an emit says so).  Also arms the buffer's
        wake-up thresholds for the wait.  ``urgent``: closing (no lingering)."""
        buf = self.buffer
        with buf.lock:
            if buf.side:
                buf.fold_side_locked()  # emitted from a signal handler
            self.seen_seq = buf.holdings.next_seq
            queue = buf.holdings.queue
            if queue:
                if self._linger_until == _INF:
                    self._linger_until = now + self.linger
                if (
                    urgent
                    or buf.flush_target >= buf.holdings.head_seq
                    or len(queue) >= self.due_events
                    or buf.holdings.queued_bytes >= self.due_bytes
                    or now >= self._linger_until
                    # Events wait beyond the queue (a spill's overflow or stretch): it holds what
                    # the window lets in, and no more can join it before this batch leaves.
                    or buf.holdings.beyond
                ):
                    buf.holdings.wake_at_locked(_INF, _INF)
                    return 0.0
                buf.holdings.wake_at_locked(self.due_events, self.due_bytes)
                return max(0.0, self._linger_until - now)
            if urgent:
                return _INF
            if self.linger > 0:
                # Look again after the linger rather than be woken by the next event: a wake-up
                # is a syscall on the emitting thread, and hands this thread the GIL in the
                # middle of the caller's work.  An event emitted meanwhile still goes within
                # the linger.  (Idle, that is ten looks a second.)
                buf.holdings.wake_at_locked(self.due_events, self.due_bytes)
                self._linger_until = now + self.linger
                return self.linger
            buf.holdings.wake_at_locked(1, _INF)
            return _INF

    # -- sizes -----------------------------------------------------------------------------

    def sample_wait(self, timeout: float, look_again: float = _INF) -> float:
        """``timeout`` shortened to the next sampling of the queued objects, if any wait, else
        to ``look_again`` (objects may come meanwhile: emit does not wake the worker for them)."""
        buf = self.buffer
        if not buf.holdings.estimated or buf.holdings.next_seq - 1 == self._sampled_seq:
            # Nothing new since the last look (read without the lock: a stale value only
            # moves the look by one wake).
            return min(timeout, look_again)
        return min(timeout, max(0.0, self._sampled_at + SAMPLE_INTERVAL - time.monotonic()))

    def sample(self, fresh: bool = False) -> None:
        """Measure the newest queued objects, if new ones came since the last look and the
        sampling interval has passed (at once for the very first object, and when ``fresh``:
        before events are taken, at the price they count for).  They are serialized in place
        (the work is not lost); when they weigh more than estimated, every queued object is
        re-priced at once and the byte bound enforced by the policy."""
        buf = self.buffer
        now = time.monotonic()
        # Half the events emit may accept beyond the last look are used (``UNLOOKED_MOST``):
        # look now, whatever the interval (emit woke this thread for it).
        behind = buf.holdings.next_seq >= buf.holdings.look_end - UNLOOKED_MOST // 2
        if not (fresh or behind) and (
            (buf.holdings.measured and now < self._sampled_at + SAMPLE_INTERVAL)
            or not buf.holdings.unmeasured_locked()
            or buf.holdings.next_seq - 1 == self._sampled_seq
        ):
            # Read without the lock first: the slices call this between events, mostly for
            # nothing (a stale read only moves a sample to the next look).
            return
        picked: list[tuple[int, Any]] = []
        with buf.lock:
            end = buf.holdings.next_seq
            if not buf.holdings.unmeasured_locked():
                buf.looked_locked(end)  # nothing waits unmeasured
                return
            if buf.holdings.measured and not (fresh or behind) and now < self._sampled_at + SAMPLE_INTERVAL:
                return
            newest = end - 1
            if newest == self._sampled_seq:
                return
            self._sampled_at, self._sampled_seq = now, newest
            picked = buf.holdings.newest_objects_locked(SAMPLE_MOST, SAMPLE_SPAN)
        # In one go, without hand-offs (a few events: its length is bounded by what they
        # weigh), so that the estimate is learnt from them at once: a flood of grown events
        # would otherwise go on at the old estimate while the sidecar waits for the GIL.
        serialize_in_place(buf, picked, SLICE, end, sidecar=True)

    def free_evicted(self) -> None:
        """Free the events ``drop_oldest`` evicted (``Holdings.evicted``) here, in slices,
        rather than on the emitting thread: freeing an object costs microseconds."""
        buf = self.buffer
        if not buf.holdings.evicted:  # (read without the lock: a stale read waits a turn)
            return
        with buf.lock:
            gone = buf.holdings.take_evicted_locked()
        checkpoint, free = self.slicer.checkpoint, gone.popleft
        for _ in range(len(gone)):
            checkpoint()
            free()

    # -- taking ----------------------------------------------------------------------------

    def take(self, events: int, nbytes: int, lookahead_bytes: int) -> list[Held]:
        """Up to ``events`` events and ``nbytes`` bytes (at least one event) from the queue,
        serialized, at most ``lookahead_bytes`` bytes of them once their exact sizes are known (what
        does not fit goes back to the queue, where the policy can shed it)."""
        self.sample(fresh=True)  # (then the take at once: what it takes, the look has seen)
        taken = self._take_pieces(events, nbytes)
        if not taken:
            return []
        buf = self.buffer
        try:
            ready = self._serialize(taken, lookahead_bytes)
        except Exception:
            # A bug of ours: back to the head of the queue first, so nothing taken is lost.
            with buf.lock:
                if not buf.finalized and not buf.holdings.untake_locked(taken):
                    # Newer events were evicted meanwhile: these older ones would have been too.
                    buf.count_locked(Reason.DROPPED_FULL, len(taken))
                    buf.holdings.note_each_locked((entry[0] for entry in taken), Reason.DROPPED_FULL)
                    buf.settle_locked(len(taken), sum(entry[2] for entry in taken), self.lowest_held())
            raise
        # What was taken, serialized now: let go of in pieces (the last references to a batch's
        # objects: freeing them at once held the GIL for about 80 µs).
        checkpoint = self.slicer.checkpoint
        while taken:
            checkpoint()
            del taken[-TAKE_PIECE:]
        return ready

    def _take_pieces(self, events: int, nbytes: int) -> list[Entry]:
        """Up to ``events`` events and ``nbytes`` bytes (at least one event) of those queued when
        it begins, in pieces of ``TAKE_PIECE``, the lock let go of and a checkpoint between two.
        What is emitted meanwhile waits for the next batch, after a look (``sample``) at it:
        taken now, objects nobody measured would go on the wire priced at the estimate, each
        piece a look's allowance more (``UNLOOKED_MOST``: the bound on them).  What the policy
        evicts meanwhile is queued, never taken."""
        buf, checkpoint = self.buffer, self.slicer.checkpoint
        taken: list[Entry] = []
        end = -1  # the number after the newest event queued when the take began
        while True:
            with buf.lock:
                held = buf.holdings
                n = len(held.queue)
                if end < 0:
                    end, left = held.numbers.end(n), n
                else:  # (only what fits the bytes left: ``take_locked`` takes one at least)
                    fits = n and (held.sizes[0] or held.estimate) <= nbytes
                    left = held.numbers.index_from(end, n) if fits else 0
                piece = held.take_locked(min(TAKE_PIECE, events - len(taken), left), nbytes) if left else []
                if not held.queue:
                    self._linger_until = _INF  # the next event starts a linger of its own
            taken += piece
            nbytes -= sum(entry[2] for entry in piece)
            if len(piece) < TAKE_PIECE or len(taken) >= events or nbytes <= 0:
                return taken
            checkpoint()

    def _serialize(self, batch: list[Entry], lookahead_bytes: int) -> list[Held]:
        """Serialize what was taken, in slices: between two events, the GIL goes to the
        application's threads once a slice has lasted its budget."""
        ready: list[Held] = []
        lost: dict[str, list[int]] = {}
        lost_bytes = adjust = sizes = objects = total = 0
        limit = self.max_batch_bytes
        untaken: list[Entry] = []
        dead: list[DeadRecord] = []
        buf = self.buffer
        # (The slice goes on from the loop's turn that took the batch: it started when the
        # sidecar last waited, or handed the GIL over.)
        checkpoint, append = self.slicer.checkpoint, ready.append
        count, twice = len(batch), 2 * lookahead_bytes
        mean = 0  # what the objects serialized so far weigh, on average
        for position, (seq, event, estimate) in enumerate(batch):
            checkpoint()
            if total > lookahead_bytes or (mean and total + (count - position) * mean > twice):
                # Taken by estimate, found larger (or about to be, at the weight of the objects
                # serialized so far): the rest goes back to the queue unserialized, where the
                # policy can shed it (serializing it now would hold it twice in memory).
                untaken = batch[position:]
                break
            cls = event.__class__
            if cls is SerializedEvent:
                ser, is_object = event, False
            else:
                is_object = cls is tuple or cls is RunRecord or not isinstance(event, _TEXT_TYPES)
                if estimate > limit and not is_object:
                    # Its exact size is known (at least its length in characters): too large
                    # for any batch, so never spend the time (and the GIL) parsing it.
                    self._too_large(seq, estimate, None, event, lost, dead)
                    lost_bytes += estimate
                    continue
                try:
                    ser = serialize(event)
                except Exception as exc:
                    self._invalid(seq, exc, event, lost, dead)
                    lost_bytes += estimate
                    continue
            key = ser[2]  # weight(ser), in line (once per event): the body and the key
            size = len(ser[0]) + len(key) if key else len(ser[0])
            if is_object:
                sizes += size
                objects += 1
                mean = sizes // objects
                if size > 2 * buf.holdings.estimate and mean > buf.holdings.estimate:
                    self._reprice_now(mean)
            if size > limit:
                self._too_large(seq, size, ser.body, event, lost, dead)
                lost_bytes += estimate
                continue
            adjust += size - estimate
            total += size
            append(_new_held(Held, (seq, ser, size)))
        checkpoint()
        ready = self._account(ready, untaken, lost, lost_bytes, adjust, mean)
        if dead and self.dead_letter is not None:
            self.dead_letter.write(dead)
        return ready

    def _account(
        self,
        ready: list[Held],
        untaken: list[Entry],
        lost: dict[str, list[int]],
        lost_bytes: int,
        adjust: int,
        mean_object: int,
    ) -> list[Held]:
        """The buffer's accounts after a batch was serialized: the untaken back in the queue,
        the in-flight bytes re-priced, the estimate learnt (``mean_object``: 0 if no object
        was serialized), the byte bound enforced, the lost counted.  Returns what goes on."""
        buf = self.buffer
        with buf.lock:
            if buf.finalized:
                return []
            if untaken and not buf.holdings.untake_locked(untaken):
                lost.setdefault(Reason.DROPPED_FULL, []).extend(entry[0] for entry in untaken)
                lost_bytes += sum(entry[2] for entry in untaken)
            buf.holdings.reprice_in_flight_locked(adjust)
            if mean_object:
                buf.learn_locked(mean_object)
            # An estimate that was short: back within max_bytes by the policy, from the queue;
            # then, if need be, from the newest of this batch (not yet sent).
            over = buf.enforce_bound_locked()
            while over > 0 and ready:
                dropped = ready.pop()
                over -= dropped.size
                lost.setdefault(Reason.DROPPED_FULL, []).append(dropped.seq)
                lost_bytes += dropped.size
            if lost:
                for reason, seqs in lost.items():
                    buf.count_locked(reason, len(seqs))
                    buf.holdings.note_each_locked(seqs, reason)
                lowest = min(self.lowest_held(), ready[0].seq if ready else _INF)
                buf.settle_locked(sum(map(len, lost.values())), lost_bytes, lowest)
        return ready

    def _reprice_now(self, mean_object: int) -> None:
        """Objects grew: re-price the queue at ``mean_object`` now (and shed by the policy), not
        once this batch is done, which may be long with handlers taking the GIL."""
        buf = self.buffer
        with buf.lock:
            buf.learn_locked(mean_object)

    def _invalid(
        self, seq: int, exc: Exception, event: Any, lost: dict[str, list[int]], dead: list[DeadRecord]
    ) -> None:
        """An event that cannot be serialized: counted ``invalid_event``, warned about, dead-lettered."""
        lost.setdefault(Reason.INVALID_EVENT, []).append(seq)
        said = described(exc)  # (the event's own exception: its message may not be readable)
        self.log.warning("invalid", "dropping an event that cannot be serialized: %s", said)
        dead.append((Reason.INVALID_EVENT, said, None, event))

    def _too_large(
        self,
        seq: int,
        size: int,
        body: bytes | None,
        event: Any,
        lost: dict[str, list[int]],
        dead: list[DeadRecord],
    ) -> None:
        limit = self.max_batch_bytes
        lost.setdefault(Reason.TOO_LARGE, []).append(seq)
        self.log.warning(
            "too_large", "dropping a %d-byte event: larger than max_batch_bytes (%d)", size, limit
        )
        dead.append((Reason.TOO_LARGE, f"larger than max_batch_bytes ({limit})", body, event))
