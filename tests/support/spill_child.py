"""A process with an outbox and a spill directory, driven by the spill tests.

    python spill_child.py '{"url": ..., "dir": ..., "mode": "stream" | "batch", ...}'

``stream``: emits ``run_event``s (run ``runs[n % len(runs)]``, ``n`` counting from ``first``)
ten at a time, printing ``"<events accepted> <time.monotonic()>"`` after each ten, until killed.
``batch``: emits ``count`` events, prints ``spilled`` once they are all on disk, then waits for
a line on standard input and closes, printing ``stats <json>``.  ``fsize``: a file size limit
(RLIMIT_FSIZE) in bytes, set before the outbox is built (SIGXFSZ ignored: writes fail with EFBIG).
``until_failed`` (batch): after that line, emits ten at a time until the spill counts a failed
write, prints ``failed <json of stats().spill>``, and waits for another line before closing.
``drop_dac``: as root, give up overriding file permissions first (see :func:`drop_dac`).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import resource
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import outbox._spill._spill
from outbox import Outbox
from outbox.transports import HttpTransport

from support.helpers import run_event


def drop_dac() -> None:
    """As root, give up CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER (effective and
    permitted, before any thread starts): a directory's mode then binds this process as it binds
    any other user, so a 0555 directory owned by root refuses it new files with EACCES.  (Not
    setuid to nobody: the interpreter may live where only root reaches, /root/.pyenv here.)
    Another user needs nothing: the 0555 directory is its own, and refuses it already."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # two of {effective, permitted, inheritable}
    if libc.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    keep = ~((1 << 1) | (1 << 2) | (1 << 3)) & 0xFFFFFFFF  # DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER
    data[0] &= keep
    data[1] &= keep
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg.get("drop_dac"):
        drop_dac()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
    if "scan_interval" in cfg:
        outbox._spill._spill.SCAN_INTERVAL = cfg["scan_interval"]
    if "fsize" in cfg:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["fsize"], cfg["fsize"]))
    box = Outbox(
        # 10 s: with 1 s, a request the sink answered late beside busy processes was sent again
        # (a duplicate, where the tests count each event once).
        HttpTransport(cfg["url"], timeout=10.0),
        spill_dir=cfg["dir"],
        spill_interval=cfg.get("interval", 0.1),
        max_events=200_000,
        max_batch_events=cfg.get("max_batch_events", 1000),
        max_bytes=512 * 1024 * 1024,
        max_spill_bytes=cfg.get("max_spill_bytes", 1024**3),
        backoff_cap=0.2,
        shutdown_timeout=cfg.get("shutdown_timeout", 5.0),
    )
    runs = cfg.get("runs") or ["00000000-0000-4000-8000-000000000000"]
    n = cfg.get("first", 0)
    out = sys.stdout
    if cfg["mode"] == "stream":
        while True:
            for _ in range(10):
                assert box.emit(run_event(run_id=runs[n % len(runs)], n=n))
                n += 1
            out.write(f"{n} {time.monotonic()}\n")
            out.flush()
            time.sleep(cfg.get("pause", 0.002))
    for _ in range(cfg["count"]):
        assert box.emit(run_event(run_id=runs[n % len(runs)], n=n))
        n += 1
    if cfg.get("wait_spilled", True):
        deadline = time.monotonic() + 10
        while box.stats().spill["written"] < cfg["count"] and time.monotonic() < deadline:
            time.sleep(0.01)
    out.write(f"spilled {json.dumps(dict(box.stats().spill))}\n")
    out.flush()
    sys.stdin.readline()
    if cfg.get("until_failed"):
        deadline = time.monotonic() + 30
        while not box.stats().spill["not_spilled_failed"] and time.monotonic() < deadline:
            for _ in range(10):
                assert box.emit(run_event(run_id=runs[n % len(runs)], n=n))
                n += 1
            time.sleep(0.01)  # the sidecar writes once an interval
        out.write(f"failed {json.dumps(dict(box.stats().spill))}\n")
        out.flush()
        sys.stdin.readline()
    if cfg.get("flush"):
        box.flush(10)
    report = box.close()
    stats = box.stats()
    out.write(
        "stats "
        + json.dumps(
            {
                "emitted": stats.emitted,
                "delivered": stats.delivered,
                "dropped": dict(stats.dropped),
                "spill": dict(stats.spill),
                "report_undelivered": dict(report.undelivered),
            }
        )
        + "\n"
    )
    out.flush()


if __name__ == "__main__":
    main()
