"""Objects that grow while the sidecar cannot run (its loop stuck in a send), two ways past the
sidecar's last look (#39 item 3): through the spill's overflow, and from several threads while
one of them measures.  ``spill`` and ``invalid`` (objects that cannot be
serialized) print the peak RSS growth too; ``threads`` and ``mix`` count
what is held (their events share their padding).

    python tests/scripts/grow_past_the_look.py spill                       # 3,000 of 100 KB
    python tests/scripts/grow_past_the_look.py threads [N] [SIZE] [EACH]   # default: 8 5000000 1000
    python tests/scripts/grow_past_the_look.py mix [PERIOD] [PHASE]        # default: 2 0
    python tests/scripts/grow_past_the_look.py invalid                     # 5,000 of 100 KB

(With ``PYTHONPATH=<a checkout>`` for another tree.)  ``spill``: the queue's window filled with
text, then the objects, all in the overflow; prints the objects held at the estimate and what they
weigh.  ``threads``: prints the most events accepted past the last look by the time of a look
(``UNLOOKED_MOST`` claimed) and what is held at the end.  ``mix``: one thread, one small object
in PERIOD (from PHASE), the others of 100 KB; prints the large ones held and what they weigh.
"""

import resource
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parents[1]))

from outbox import Outbox, Outcome
from outbox._buffer._buffer import UNLOOKED_MOST, Buffer

from support import parts
from support.helpers import run_event

MAX_BYTES = 8 * 1024 * 1024


class _Stuck:
    """Blocks its sidecar's event loop in send until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    async def send(self, batch: Any, deadline: float) -> list[Any]:
        self.entered.set()
        self.release.wait(120)
        return [Outcome.delivered()] * len(batch)

    async def aclose(self) -> None:
        pass


def _padded(n: int, pad: str) -> list[dict[str, Any]]:
    events = []
    for i in range(n):
        event = run_event(n=i)
        event["run"]["facets"]["pad"] = {"_producer": "p", "_schemaURL": "s", "x": pad}
        events.append(event)
    return events


def _stuck_outbox(**kw: Any) -> tuple[Outbox, _Stuck]:
    transport = _Stuck()
    outbox = Outbox(transport, linger=0, close_at_exit=False, **kw)
    assert outbox.emit(run_event())  # measured by the sidecar, then its loop is stuck
    assert transport.entered.wait(10)
    return outbox, transport


def _close(outbox: Outbox, transport: _Stuck) -> None:
    transport.release.set()
    report = outbox.close(20)
    lost = sum(report.undelivered.values())
    print(f"close: emitted {report.emitted}, delivered {report.delivered}, lost {lost} {report.undelivered}")


def spill() -> None:
    outbox, transport = _stuck_outbox(max_bytes=MAX_BYTES, spill_dir=tempfile.mkdtemp())
    buf = parts.buffer(outbox)
    text = orjson.dumps({"eventType": "START", "x": "y" * 100_000}).decode()
    while not buf.holdings.overflow.active:
        outbox.emit(text)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    size = 0
    for i in range(3_000):  # each its own padding: the process's growth is what is held
        (event,) = _padded(1, f"{i:06d}" * 16_667)
        size = len(orjson.dumps(event))
        outbox.emit(event)
        del event
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    held = sum(1 for e in [*buf.holdings.queue, *buf.holdings.overflow.events] if isinstance(e, dict))
    print(
        f"objects of {size:,} bytes held at the estimate ({buf.holdings.estimate:,}): {held:,}, "
        f"{held * size / 2**20:.1f} MiB, max_bytes {MAX_BYTES / 2**20:.0f} MiB; "
        f"the process grew {grown:.0f} MiB"
    )
    _close(outbox, transport)


def threads(n: int, size: int, each: int) -> None:
    outbox, transport = _stuck_outbox(max_bytes=64 * 1024 * 1024)
    worst = [0]
    looked = Buffer.looked_locked

    def looked_locked(self: Buffer, end: int, measured: bool = True) -> None:
        held = self.holdings
        worst[0] = max(worst[0], held.next_seq - (held.look_end - UNLOOKED_MOST))
        looked(self, end, measured)

    Buffer.looked_locked = looked_locked  # type: ignore[method-assign]
    events = _padded(each, "x" * size)
    start = threading.Barrier(n)

    def emit_all() -> None:
        start.wait()
        for event in events:
            outbox.emit(event)

    workers = [threading.Thread(target=emit_all) for _ in range(n)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(f"{n} threads, objects of {size:,} bytes: at most {worst[0]:,} events past the last look at a look")
    _close(outbox, transport)


def invalid() -> None:
    outbox, transport = _stuck_outbox(max_bytes=MAX_BYTES)
    buf = parts.buffer(outbox)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for i in range(5_000):
        (event,) = _padded(1, f"{i:06d}" * 16_667)
        event["run"]["facets"]["bad"] = {1, 2}  # cannot be serialized
        outbox.emit(event)
        del event
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(
        f"5,000 objects of 100 KB that cannot be serialized: {len(buf.holdings.queue):,} held, "
        f"max_bytes {MAX_BYTES / 2**20:.0f} MiB; the process grew {grown:.0f} MiB"
    )
    _close(outbox, transport)


def mix(period: int, phase: int) -> None:
    outbox, transport = _stuck_outbox(max_bytes=MAX_BYTES)
    buf = parts.buffer(outbox)
    large, small = _padded(1, "x" * 100_000)[0], run_event()
    size = len(orjson.dumps(large))
    for i in range(60_000):
        outbox.emit(large if (i + phase) % period else small)
    held = sum(1 for e in buf.holdings.queue if e is large)
    print(
        f"one small object in {period}, the others of {size:,} bytes: {held:,} of them held at the "
        f"estimate ({buf.holdings.estimate:,}), {held * size / 2**20:.1f} MiB, "
        f"max_bytes {MAX_BYTES / 2**20:.0f} MiB"
    )
    _close(outbox, transport)


if __name__ == "__main__":
    if sys.argv[1:2] == ["spill"]:
        spill()
    elif sys.argv[1:2] == ["invalid"]:
        invalid()
    elif sys.argv[1:2] == ["mix"]:
        mix(*(int(a) for a in (sys.argv[2:] + ["2", "0"][len(sys.argv[2:]) :])))
    else:
        n, size, each = (int(a) for a in (sys.argv[2:] + ["8", "5000000", "1000"][len(sys.argv[2:]) :]))
        threads(n, size, each)
