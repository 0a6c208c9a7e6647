"""Disk faults produced for real under the spill: a full filesystem (ENOSPC, a 1 MiB tmpfs),
counted under its own name in ``stats().spill`` (``failed_enospc``), warned about once with the
path and the fix, ``emit`` never raising and the outbox going on in memory (every event
delivered or counted); a read-only filesystem (EROFS), which the kernel lets no one impose under
a running outbox (EBUSY while files are open for writing), so met at construction.

Mounting needs root (CAP_SYS_ADMIN), as in this project's CI containers; elsewhere the file
size limit test of test_spill.py (EFBIG) covers the same path.

A directory that refuses new files (EACCES), produced by the kernel's permission check: root
would pass a 0555 directory, so the child gives up CAP_DAC_OVERRIDE (and CAP_DAC_READ_SEARCH,
CAP_FOWNER) before it starts its outbox (as another user it has nothing to give up, and the
directory is its own); the directory is made 0555 once its first segment is written, and the
next segment (and the checkpoint, once events settle) is refused.  That test needs no mount
and never skips: a process that the 0555 directory does not stop fails it."""

from __future__ import annotations

import json
import logging
import subprocess
import time

import pytest

from outbox import ConfigError, Outbox
from outbox._spill._disk import RETRY_AFTER
from outbox.tools.faultproxy import FaultProxy
from outbox.tools.sink import Sink
from outbox.transports import HttpTransport

from support import parts
from support.helpers import run_event, wait_until
from support.spill_children import read_line, start_child, tell


def spill_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "outbox" and "spill: writing to" in r.getMessage()
    ]


@pytest.mark.parametrize("policy", ["drop_newest", "drop_oldest"])
def test_a_full_filesystem_is_counted_as_enospc_warned_once_and_the_outbox_goes_on(tmpfs, caplog, policy):
    """Under drop_newest an accepted event is never given up: every one is delivered.  Under
    drop_oldest (the default) the overflow that the failing disk leaves in memory fills while
    the backend is down, and the oldest queued events make room for the newest: so there,
    the sink holds exactly what ``delivered`` counts and the rest is counted ``dropped_full``."""
    caplog.set_level(logging.WARNING, logger="outbox")
    spill = tmpfs / "spill"
    with Sink() as sink, FaultProxy("127.0.0.1", sink.port, mode="refuse") as proxy:
        box = Outbox(
            HttpTransport(proxy.url, timeout=0.5),
            spill_dir=str(spill),
            max_events=200,
            policy=policy,
            shutdown_timeout=30,
            backoff_cap=0.5,
        )
        accepted = 0
        body = "x" * 2000  # about 2.3 KB an event: the 1 MiB filesystem fills within 500
        for n in range(1500):
            event = run_event(n=n)
            event["run"]["facets"] = {"pad": {"_producer": "p", "_schemaURL": "s", "v": body}}
            accepted += box.emit(event)  # never raises
            if n % 10 == 0 and not box.stats().spill.get("failed_enospc"):  # paced until full
                wait_until(lambda: parts.in_window(box) < 40, 1)
        assert wait_until(lambda: box.stats().spill.get("failed_enospc", 0) > 0), box.stats().spill
        warnings = spill_warnings(caplog)
        assert len(warnings) == 1, warnings
        assert str(spill) in warnings[0]
        assert "the disk is full" in warnings[0]
        proxy.mode = "pass"
        report = box.close(30)
        assert not report.timed_out, report
        assert report.pending == 0, report
        stats = box.stats()
        assert stats.emitted == stats.delivered + sum(stats.dropped.values()), stats
        assert set(stats.dropped) <= {"dropped_full", "dropped_spill_full"}, stats.dropped
        # Each event the outbox counts delivered reached the sink, and nothing else did.  (At the
        # wire, at least once: beside load a request of 100 was taken by the sink and its answer
        # lost on the way back (ReadError), so the outbox sent it again and counted it once.)
        delivered = [e["n"] for e in sink.events]
        assert len(set(delivered)) == stats.delivered, stats
        if policy == "drop_newest":
            assert stats.delivered == accepted, (stats, accepted)
            assert sorted(set(delivered))[:10] == list(range(10))
        else:
            assert 0 < stats.delivered <= accepted, (stats, accepted)


def test_a_read_only_filesystem_at_construction_is_a_config_error_naming_it(tmpfs):
    """EROFS.  A filesystem cannot be remounted read-only under a running outbox (the kernel
    answers EBUSY while its lock and segment are open for writing), so the read-only case a
    process meets is at construction: a ConfigError naming the directory, the error, the fix."""
    spill = tmpfs / "spill"
    spill.mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    try:
        with pytest.raises(ConfigError) as caught:
            Outbox(HttpTransport("http://127.0.0.1:9"), spill_dir=str(spill))
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(tmpfs)], check=False)
    message = str(caught.value)
    assert str(spill) in message
    assert "Read-only file system" in message
    assert "writable" in message


def test_a_directory_that_refuses_new_files_is_counted_as_eacces_warned_once_and_the_outbox_goes_on(
    tmp_path,
):
    """EACCES, from the kernel's own permission check.  The child gives up overriding file
    permissions (as root: CAP_DAC_OVERRIDE and kin; another user has nothing to give up), writes
    its first segment, then its directory is made 0555 under it: its open segment still takes
    appends, and the first new file (the next segment, 32 KiB on: max_spill_bytes of 256 KiB)
    is refused."""
    spill = tmp_path / "spill"
    spill.mkdir(mode=0o755)
    with Sink() as sink, FaultProxy("127.0.0.1", sink.port, mode="refuse") as proxy:
        child = start_child(
            {
                "url": proxy.url,
                "dir": str(spill),
                "mode": "batch",
                "count": 10,
                "until_failed": True,
                "flush": True,
                "drop_dac": True,
                "max_spill_bytes": 256 * 1024,
            }
        )
        home = spill
        try:
            first = json.loads(read_line(child, "spilled "))
            assert (first["written"], first["segments"]) == (10, 1), first
            (home,) = [path for path in spill.iterdir() if path.is_dir()]  # the child's own
            home.chmod(0o555)
            refused_at = time.monotonic()
            tell(child)
            failed = json.loads(read_line(child, "failed "))
            assert failed.get("failed_eacces", 0) > 0, failed
            proxy.mode = "pass"  # the events held in memory all along go now
            tell(child)
            stats = json.loads(read_line(child, "stats "))
            took = time.monotonic() - refused_at
            _, err = child.communicate(timeout=15)
        finally:
            if child.poll() is None:
                child.kill()
            home.chmod(0o755)
        assert child.returncode == 0, err  # emit never raised (the child asserts it returned True)
        assert "send raised" not in err, err  # (a refused connection is the backend's trouble, not a bug)
        spill_stats = stats["spill"]
        assert {k for k in spill_stats if k.startswith("failed_")} == {"failed_eacces"}, spill_stats
        assert spill_stats["not_spilled_failed"] > 0, spill_stats
        # The new segment and, once events settle, the checkpoint: each tried again RETRY_AFTER
        # (5 s) later, not at every interval.
        assert spill_stats["failed_eacces"] <= 2 * (1 + took / RETRY_AFTER), (spill_stats, took)
        # (Beside the backend's own: "could not deliver ... retrying".)
        # And, at the close, that what it delivered could not be written down: its files stay
        # (they cannot be deleted either), and the next outbox would deliver those again.
        warnings = [line for line in err.splitlines() if line.startswith("WARNING spill")]
        assert len(warnings) == 2, err
        for part in ("spill: writing to", str(spill), "Permission denied", "make the directory writable"):
            assert part in warnings[0], warnings
        for part in ("were delivered, but that could not be written down", "EACCES", "delivers them again"):
            assert part in warnings[1], warnings
        assert stats["dropped"] == {}, stats
        assert stats["delivered"] == stats["emitted"] > 10, stats
        delivered = sorted({e["n"] for e in sink.events})
        assert delivered == list(range(stats["emitted"]))
