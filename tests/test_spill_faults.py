"""Disk faults produced for real under the spill: a full filesystem (ENOSPC, a 1 MiB tmpfs),
counted under its own name in ``stats().spill`` (``failed_enospc``), warned about once with the
path and the fix, ``emit`` never raising and the outbox going on in memory (every event
delivered or counted); a read-only filesystem (EROFS), which the kernel lets no one impose under
a running outbox (EBUSY while files are open for writing), so met at construction.

Mounting needs root (CAP_SYS_ADMIN), as in this project's CI containers; elsewhere the file
size limit test of test_spill.py (EFBIG) covers the same path.  EACCES is not produced here:
root bypasses a 0555 directory's permissions, so a chmod cannot make the disk refuse root."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox import ConfigError, Outbox
from outbox.tools.faultproxy import FaultProxy
from outbox.tools.sink import Sink
from outbox.transports import HttpTransport

from support.helpers import run_event, wait_until


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "mnt"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def spill_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "outbox" and "spill: writing to" in r.getMessage()
    ]


def test_a_full_filesystem_is_counted_as_enospc_warned_once_and_the_outbox_goes_on(tmpfs, caplog):
    caplog.set_level(logging.WARNING, logger="outbox")
    spill = tmpfs / "spill"
    with Sink() as sink, FaultProxy("127.0.0.1", sink.port, mode="refuse") as proxy:
        box = Outbox(
            HttpTransport(proxy.url, timeout=0.5),
            spill_dir=str(spill),
            max_events=200,
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
                wait_until(lambda: len(box._buffer.window.events) < 40, 1)
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
        assert stats.emitted == stats.delivered + sum(stats.dropped.values())
        assert set(stats.dropped) <= {"dropped_full", "dropped_spill_full"}, stats.dropped
        assert stats.delivered == accepted
        assert sorted(e["n"] for e in sink.events)[:10] == list(range(10))
        assert len({e["n"] for e in sink.events}) == accepted


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
