"""A process with an outbox and a spill directory, driven by the spill tests.

    python spill_child.py '{"url": ..., "dir": ..., "mode": "stream" | "batch", ...}'

``stream``: emits ``run_event``s (run ``runs[n % len(runs)]``, ``n`` counting from ``first``)
ten at a time, printing ``"<events accepted> <time.monotonic()>"`` after each ten, until killed.
``batch``: emits ``count`` events, prints ``spilled`` once they are all on disk, then waits for
a line on standard input and closes, printing ``stats <json>``.  ``fsize``: a file size limit
(RLIMIT_FSIZE) in bytes, set before the outbox is built (SIGXFSZ ignored: writes fail with EFBIG).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import outbox._spill
from outbox import Outbox
from outbox.transports import HttpTransport

from support.helpers import run_event


def main() -> None:
    cfg = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
    if "scan_interval" in cfg:
        outbox._spill.SCAN_INTERVAL = cfg["scan_interval"]
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
        max_bytes=512 * 1024 * 1024,
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
    if cfg.get("flush"):
        box.flush(10)
    report = box.close()
    stats = box.stats()
    out.write(
        "stats "
        + json.dumps(
            {
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
