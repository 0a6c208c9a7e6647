"""The dead-letter file and ``outbox replay`` (a real HTTP backend on loopback; writers that
are SIGKILLed, that hit a file-size limit, that race each other in other processes)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import orjson
import pytest

from outbox import ConfigError, Outbox
from outbox._deadletter import DeadLetter, Entry, Torn, scan
from outbox.tools.sink import Sink, SinkBehaviour
from outbox.transports import HttpTransport

from support.counting_server import CountingServer
from support.helpers import refused_port, run_event, wait_until

ROOT = Path(__file__).parent.parent


def read(path) -> list:
    with open(path, "rb") as file:
        return list(scan(file))


def events_of(items) -> list[int]:
    return [orjson.loads(item.event)["n"] for item in items if isinstance(item, Entry) and item.event]


def replay(path, url=None, *args, env=None, timeout=60):
    """``outbox replay`` as an operator runs it: a new process, an environment of its own."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_"))}
    home = Path(path).parent / "home"
    home.mkdir(exist_ok=True)  # no ~/.openlineage/openlineage.yml of this machine's
    base.update(HOME=str(home), **({"OPENLINEAGE_URL": url} if url else {}), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "outbox.tools.cli", "replay", str(path), *args],
        capture_output=True,
        text=True,
        env=base,
        cwd=home,
        timeout=timeout,
    )


def child(script: str, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def records(first: int, count: int) -> list:
    return [("poison", "500", orjson.dumps(run_event(n=n)), None) for n in range(first, first + count)]


# -- what a record holds ---------------------------------------------------------------------


def test_every_event_settled_for_good_leaves_a_whole_trace_in_the_dead_letter_file(tmp_path):
    path = tmp_path / "dead.jsonl"
    with Sink(behaviour=SinkBehaviour(poison="POISON")) as sink:
        outbox = Outbox(
            HttpTransport(sink.url, mode="single"),
            dead_letter=path,
            max_batch_bytes=50_000,
            linger=0.01,
            close_at_exit=False,
        )
        bad = run_event(n=1)
        bad["run"]["runId"] = "not-a-uuid"  # 422
        poison = run_event(n=2, job="POISON")  # 500, alone, while others go through
        unserializable = run_event(n=3)
        unserializable["run"]["facets"] = {"x": {"_producer": "p", "_schemaURL": "s", "v": object()}}
        big = run_event(n=4)
        big["run"]["facets"] = {"x": {"_producer": "p", "_schemaURL": "s", "v": "x" * 60_000}}
        # Pre-serialized and too large: kept whole (it used to be a 10,000-character repr).
        big_text = run_event(n=6)
        big_text["run"]["facets"] = {"x": {"_producer": "p", "_schemaURL": "s", "v": "y" * 70_000}}
        # Pre-serialized over several lines and refused: still one line in the file.
        pretty = run_event(n=8)
        pretty["run"]["runId"] = "also-not-a-uuid"
        for event in (
            run_event(n=0),
            bad,
            poison,
            unserializable,
            big,
            json.dumps(big_text),
            json.dumps(pretty, indent=2),
            "not json at all",
            run_event(n=5),
        ):
            assert outbox.emit(event)
        report = outbox.close(30)
    assert report.delivered == 2
    items = read(path)
    assert not [item for item in items if isinstance(item, Torn)]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len(items) == 7
    assert dict(report.undelivered) == {
        "rejected_by_backend": 2,
        "poison": 1,
        "too_large": 2,
        "invalid_event": 2,
    }
    by_n = {line["event"]["n"]: line for line in lines if "event" in line}
    by_n[8] = next(line for line in lines if line.get("event_text", "").startswith("{"))
    assert sorted(by_n) == [1, 2, 4, 6, 8]
    assert by_n[1]["reason"] == "rejected_by_backend"
    assert "422" in by_n[1]["answer"]
    assert by_n[2]["reason"] == "poison"
    assert "500" in by_n[2]["answer"]
    assert by_n[4]["reason"] == by_n[6]["reason"] == "too_large"
    assert by_n[4]["event"] == json.loads(json.dumps(big))
    assert by_n[6]["event"] == big_text  # whole, as JSON
    assert by_n[8]["event_text"] == json.dumps(pretty, indent=2)  # its text, on one line
    unsent = [line for line in lines if "event" not in line and line is not by_n[8]]
    assert {line["reason"] for line in unsent} == {"invalid_event"}
    assert "object" in next(line["event_repr"] for line in unsent if "event_repr" in line)
    assert next(line["event_text"] for line in unsent if "event_text" in line) == "not json at all"
    assert all(line["time"].startswith("20") and len(line["crc32"]) == 8 for line in lines)


def text_events() -> list[str | bytes]:
    """Pre-serialized events that a parse and re-encode would alter: spacing, ``1E2``, a
    30-digit integer, escapes, key order, several lines, a trailing newline, UTF-8 bytes."""
    head = '"eventType":"START","eventTime":"2026-12-02T10:00:00+00:00","producer":"p"'

    def run(n: int) -> str:
        return f'"run":{{"runId":"{uuid.UUID(int=n)}"}},"job":{{"namespace":"tests","name":"text"}}'

    return [
        f'{{ {head}, {run(0)},  "n" : 0, "ratio": 1E2, "big": 123456789012345678901234567890 }}',
        f'{{"n":1,{head},{run(1)},"s":"caf\\u00e9 \\/ \\"q\\"","z":0.10}}',
        f'{{\n  "n": 2,\n  {head},\n  {run(2)},\n  "pad": "{"x" * 3000}"\n}}',
        f'{{"n":3,{head},{run(3)}}}\n',
        f'{{"n":4,{head},{run(4)},"name":"café","pad":"{"y" * 3000}"}}\r\n'.encode(),
    ]


def test_a_text_event_is_kept_byte_for_byte_and_replayed_unchanged(tmp_path):
    """Refused by the backend or too large, a pre-serialized event is in the file as it would
    have been sent (not re-encoded: 1E2 stays 1E2, a 30-digit integer stays whole), and
    replay sends those very bytes."""
    path = tmp_path / "dead.jsonl"
    texts = text_events()
    with Sink(behaviour=SinkBehaviour(fail_status=400, single_only=True)) as sink:
        outbox = Outbox(
            HttpTransport(sink.url, mode="single"),
            dead_letter=path,
            max_batch_bytes=2000,  # the two with a pad are too large, the rest refused (400)
            linger=0.01,
            close_at_exit=False,
        )
        for text in texts:
            assert outbox.emit(text)
        report = outbox.close(10)
    assert report.undelivered == {"rejected_by_backend": 3, "too_large": 2}, report
    items = read(path)
    assert not [item for item in items if isinstance(item, Torn)]
    wanted = [text.encode() if isinstance(text, str) else text for text in texts]
    assert sorted(item.event for item in items) == sorted(wanted)
    lines = path.read_bytes().splitlines()
    assert len(lines) == 5  # one line each, newlines and all
    # Still JSON lines: those on one line as ``event``, the others' text in ``event_text``.
    records = [json.loads(line) for line in lines]
    assert sorted(r["event"]["n"] for r in records if "event" in r) == [0, 1]
    assert sorted(r["event_text"].encode() for r in records if "event_text" in r) == sorted(wanted[2:])
    with CountingServer() as server:  # keeps every body it is sent, as received
        result = replay(
            path,
            env={
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": server.url,
                "OPENLINEAGE__TRANSPORT__MODE": "single",
                "OUTBOX_MAX_BATCH_BYTES": "1MiB",
            },
        )
        bodies = list(server.bodies)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(bodies) == sorted(wanted)


def test_text_that_is_no_json_object_is_kept_as_text_and_never_replayed(tmp_path):
    path = tmp_path / "dead.jsonl"
    kept = ["[1, 2]", "not json", '{"a": "\ud800"}', b'{"a": "\xff"}']  # a lone surrogate, bad UTF-8
    DeadLetter(path).write([("invalid_event", "why", None, text) for text in kept])
    items = read(path)
    assert [type(item) for item in items] == [Entry] * 4
    assert [item.event for item in items] == [None] * 4
    texts = [json.loads(line)["event_text"] for line in path.read_text().splitlines()]
    assert texts[:2] == ["[1, 2]", "not json"]
    assert texts[2:] == ['{"a": "\\xed\\xa0\\x80"}', '{"a": "\\xff"}']  # what the bytes were


def test_a_record_whose_bytes_changed_is_detected(tmp_path):
    path = tmp_path / "dead.jsonl"
    DeadLetter(path).write(records(0, 3))
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"n":1', b'"n":7'))  # a flipped digit, the JSON still valid
    items = read(path)
    assert [type(item) for item in items] == [Entry, Torn, Entry]
    assert events_of(items) == [0, 2]


# -- crashes and full disks ------------------------------------------------------------------

KILLED_WRITER = """
    import sys, orjson
    sys.path.insert(0, "tests")
    from support.helpers import run_event
    from outbox._deadletter import DeadLetter
    dead = DeadLetter(sys.argv[1], max_bytes=1 << 40)
    dead.write([("poison", "500", orjson.dumps(run_event(n=n)), None) for n in range(5)])
    huge = run_event(n=99)
    huge["pad"] = "x" * (64 << 20)  # one write long enough to be killed in the middle of
    body = orjson.dumps(huge)
    print("ready", flush=True)
    while True:
        dead.write([("poison", "500", body, None)])
"""


def kill_mid_write(path: Path) -> None:
    """Run a writer and SIGKILL it while it writes; until its file ends torn (one try, as a
    rule: the kernel cuts a regular file's write short at a fatal signal)."""
    for _ in range(10):
        path.unlink(missing_ok=True)
        writer = child(KILLED_WRITER, str(path))
        try:
            assert writer.stdout.readline() == "ready\n", writer.stderr.read()
            small = path.stat().st_size
            deadline = time.monotonic() + 30
            while path.stat().st_size == small:  # the huge write has begun
                assert writer.poll() is None, writer.stderr.read()
                assert time.monotonic() < deadline
                time.sleep(0.001)
            writer.send_signal(signal.SIGKILL)
        finally:
            writer.kill()
            writer.wait(10)
        with open(path, "rb") as file:
            file.seek(-1, os.SEEK_END)
            if file.read(1) != b"\n":
                return
    raise AssertionError("ten writers killed and not one mid-write")


def test_a_writer_sigkilled_mid_write_leaves_a_torn_tail_that_is_skipped_and_never_glued(tmp_path):
    path = tmp_path / "dead.jsonl"
    kill_mid_write(path)
    # The next process appends: its first record starts on a line of its own.
    DeadLetter(path).write(records(5, 3))
    items = read(path)
    assert [type(item) for item in items] == [Entry] * 5 + [Torn] + [Entry] * 3
    assert [item.line for item in items] == list(range(1, 10))  # the torn one on a line of its own
    assert events_of(items) == list(range(8))
    with Sink() as sink:
        result = replay(path, sink.url)
        assert sorted(e["n"] for e in sink.events) == list(range(8))
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("torn") == 1, result.stderr
    assert "line 6" in result.stderr
    assert "Traceback" not in result.stderr
    assert "replayed 8 events" in result.stdout


def test_a_full_disk_cuts_back_to_the_last_whole_record_and_the_next_write_is_whole(tmp_path):
    # RLIMIT_FSIZE in a child: writes past it fail with EFBIG (Python ignores SIGXFSZ), as on a
    # full disk; the limit lifted is the disk freed.
    path = tmp_path / "dead.jsonl"
    script = """
        import json, logging, os, resource, sys, orjson
        logging.basicConfig()
        sys.path.insert(0, "tests")
        from support.helpers import run_event
        from outbox._deadletter import DeadLetter
        def records(first, count):
            return [("poison", "", orjson.dumps(run_event(n=n)), None) for n in range(first, first + count)]
        dead = DeadLetter(sys.argv[1])
        dead.write(records(0, 5))
        size = os.stat(sys.argv[1]).st_size
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + size // 5 * 3 // 2, hard))  # 1.5 records
        dead.write(records(5, 3))
        full = os.stat(sys.argv[1]).st_size
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        dead.write(records(8, 2))
        print(json.dumps({"stats": dead.stats(), "size": size, "full": full}))
    """
    writer = child(script, str(path))
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    result = json.loads(out)
    assert result["stats"] == {"written": 8, "not_written": {"dead_letter_error": 2}}
    assert result["full"] < result["size"] * 8 // 5  # cut back: one whole record more, not 1.5
    assert "cannot write the dead-letter file" in err
    assert "dead_letter_error" in err
    items = read(path)
    assert not [item for item in items if isinstance(item, Torn)]
    assert events_of(items) == [0, 1, 2, 3, 4, 5, 8, 9]


def test_a_torn_tail_that_could_not_be_cut_back_is_not_glued_either(tmp_path):
    # The old writer's file: a torn record at the end, left by a crash.
    path = tmp_path / "dead.jsonl"
    DeadLetter(path).write(records(0, 2))
    with open(path, "ab") as file:
        file.write(b'{"time":"2026-12-02T10:00:00+00:00","reason":"po')
    DeadLetter(path).write(records(2, 2))
    items = read(path)
    assert [type(item) for item in items] == [Entry, Entry, Torn, Entry, Entry]
    assert [item.line for item in items] == [1, 2, 3, 4, 5]
    assert events_of(items) == [0, 1, 2, 3]


def test_writers_in_several_processes_at_once_keep_every_record_whole(tmp_path):
    path = tmp_path / "dead.jsonl"
    script = """
        import json, sys, orjson
        sys.path.insert(0, "tests")
        from support.helpers import run_event
        from outbox._deadletter import DeadLetter
        dead = DeadLetter(sys.argv[1], max_bytes=200_000)
        base = int(sys.argv[2])
        for i in range(40):
            batch = [orjson.dumps(run_event(n=base + i * 5 + k)) for k in range(5)]
            dead.write([("poison", "500", body, None) for body in batch])
        print(json.dumps(dead.stats()))
    """
    writers = [child(script, str(path), str(1000 * w)) for w in range(3)]
    stats = []
    for writer in writers:
        out, err = writer.communicate(timeout=60)
        assert writer.returncode == 0, err
        stats.append(json.loads(out))
    assert sum(s["written"] + sum(s["not_written"].values()) for s in stats) == 600
    kept = read(path) + read(str(path) + ".1")
    assert not [item for item in kept if isinstance(item, Torn)]
    assert len(events_of(kept)) == sum(s["written"] for s in stats)
    assert len(set(events_of(kept))) == len(events_of(kept))
    assert path.stat().st_size <= 200_000
    assert Path(str(path) + ".1").stat().st_size <= 200_000


# -- the size cap ----------------------------------------------------------------------------


def test_the_file_is_rotated_at_its_cap_and_a_full_one_counts_what_it_could_not_take(tmp_path, caplog):
    path = tmp_path / "dead.jsonl"
    rotated = Path(str(path) + ".1")
    with Sink() as sink:
        sink.behaviour.fail_status = 400  # every event refused for good
        outbox = Outbox.from_env(
            {
                "OPENLINEAGE_URL": sink.url,
                "OUTBOX_DEAD_LETTER": str(path),
                "OUTBOX_DEAD_LETTER_MAX_BYTES": "20KiB",
                # One batch on the wire at a time: each event is a run of its own, so with
                # lanes the answers (and the dead letters) may come in any order (CI once
                # saw the newest batch answered first).
                "OUTBOX_MAX_CONCURRENCY": "1",
            },
            close_at_exit=False,
        )
        for n in range(200):
            assert outbox.emit(run_event(n=n))
        report = outbox.close(30)
        dead = outbox._dead_letter
        public = outbox.stats().dead_letter
    assert report.undelivered == {"rejected_by_backend": 200}
    assert path.stat().st_size <= 20 * 1024
    assert rotated.stat().st_size <= 20 * 1024
    first, second = read(rotated), read(path)
    kept = events_of(first) + events_of(second)
    assert kept == list(range(len(kept)))  # the oldest kept, in order, the rest counted
    stats = dead.stats()
    assert stats["written"] == len(kept) > 20
    assert stats["not_written"] == {"dead_letter_full": 200 - len(kept)}
    # The named reason is in the outbox's own stats(), not only in a log line.
    assert public == {"written": len(kept), "dead_letter_full": 200 - len(kept)}
    assert "dead_letter_full" in caplog.text
    assert "is full" in caplog.text
    # Replayed and removed: room again.
    rotated.unlink()
    dead.write(records(500, 3))
    again = events_of(read(rotated)) + events_of(read(path))
    assert again == [*events_of(second), 500, 501, 502]
    assert len(events_of(read(path))) >= 1


def test_a_fork_child_counts_its_own_dead_letters_from_zero(tmp_path):
    path = tmp_path / "dead.jsonl"
    outbox = Outbox(HttpTransport("http://127.0.0.1:9"), dead_letter=path, close_at_exit=False)
    outbox.emit('{"broken": 1')  # invalid_event: dead-lettered
    assert wait_until(lambda: outbox.stats().dead_letter == {"written": 1}), outbox.stats()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            outbox.emit('{"broken": 2')
            wait_until(lambda: outbox.stats().dead_letter.get("written", 0) >= 1, 10)
            code = 0 if outbox.stats().dead_letter == {"written": 1} else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0  # 3: the child counted its parent's record as its own
    assert outbox.stats().dead_letter == {"written": 1}
    outbox.close(5)
    assert len(events_of(read(path))) == 0  # neither was an event
    assert len(read(path)) == 2


def test_a_record_larger_than_the_cap_is_counted_and_the_rest_still_written(tmp_path):
    path = tmp_path / "dead.jsonl"
    dead = DeadLetter(path, max_bytes=2000)
    big = run_event(n=1)
    big["pad"] = "x" * 5000
    dead.write([*records(0, 1), ("poison", "500", orjson.dumps(big), None), *records(2, 1)])
    assert events_of(read(path)) == [0, 2]
    assert dead.stats() == {"written": 2, "not_written": {"dead_letter_full": 1}}


def test_the_cap_is_validated_at_construction(tmp_path):
    with pytest.raises(ConfigError, match="dead_letter_max_bytes"):
        Outbox(HttpTransport("http://127.0.0.1:9"), dead_letter=tmp_path / "d.jsonl", dead_letter_max_bytes=0)
    with pytest.raises(ConfigError, match="OUTBOX_DEAD_LETTER_MAX_BYTES"):
        Outbox.from_env({"OUTBOX_DEAD_LETTER_MAX_BYTES": "lots"}, close_at_exit=False)


# -- an unwritable path ----------------------------------------------------------------------


def test_dead_letter_in_a_missing_folder_or_on_a_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        Outbox(HttpTransport("http://127.0.0.1:9"), dead_letter=tmp_path / "nope" / "dead.jsonl")
    with pytest.raises(
        ConfigError, match=r"is a directory; name a file in it, such as .*dead-letters\.jsonl"
    ):
        Outbox(HttpTransport("http://127.0.0.1:9"), dead_letter=tmp_path)
    os.mkfifo(tmp_path / "fifo")  # no reader: refused at once, not waited on
    with pytest.raises(ConfigError, match="is a FIFO"):
        Outbox(HttpTransport("http://127.0.0.1:9"), dead_letter=tmp_path / "fifo")
    outbox = Outbox.from_env({"OUTBOX_DEAD_LETTER": str(tmp_path / "d.jsonl")}, close_at_exit=False)
    assert outbox._dead_letter is not None
    outbox.close(0)


def test_dead_letter_on_a_fifo_with_a_reader_or_a_device_is_a_config_error(tmp_path):
    # A FIFO that someone reads opens fine, and would block the sidecar once the reader stops;
    # /dev/null keeps nothing while the outbox says it keeps dead letters.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(ConfigError, match=r"is a FIFO \(named pipe\), not a regular file"):
            Outbox(HttpTransport("http://127.0.0.1:9"), dead_letter=fifo, close_at_exit=False)
    finally:
        os.close(reader)
    for device in ("/dev/null", "/dev/full"):
        with pytest.raises(ConfigError, match=f"dead_letter='{device}' is a device, not a regular file"):
            Outbox(HttpTransport("http://127.0.0.1:9"), dead_letter=device, close_at_exit=False)


CONSTRUCT = """
    import sys
    from outbox import ConfigError, Outbox
    from outbox.transports import HttpTransport
    try:
        Outbox(HttpTransport("http://127.0.0.1:9"), dead_letter=sys.argv[1], close_at_exit=False)
    except ConfigError as exc:
        print(exc)
    else:
        print("accepted")
"""


def test_dead_letter_in_a_folder_this_process_may_not_write_is_a_config_error(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    prefix: list[str] = []
    if os.geteuid() == 0:  # root writes anywhere: run the child without that power
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: cannot drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all"]
    target = folder / "dead.jsonl"
    result = subprocess.run(
        [*prefix, sys.executable, "-c", textwrap.dedent(CONSTRUCT), str(target)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    folder.chmod(0o755)
    assert result.returncode == 0, result.stderr
    message = result.stdout
    assert f"dead_letter={str(target)!r} cannot be written (Permission denied)" in message
    assert f"make {str(folder)!r} writable" in message
    assert "OUTBOX_DEAD_LETTER" in message


def test_dead_letter_on_a_read_only_filesystem_is_a_config_error(tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    script = (
        f"mount -t tmpfs -o ro,size=64k tmpfs {mount} && "
        f"exec {sys.executable} -c '{textwrap.dedent(CONSTRUCT)}' {mount}/dead.jsonl"
    )
    probe = (
        subprocess.run(["unshare", "-m", "true"], capture_output=True) if shutil.which("unshare") else None
    )
    if probe is None or probe.returncode != 0:
        pytest.skip("no mount namespace here (unshare -m): cannot make a read-only filesystem")
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "cannot be written (Read-only file system)" in result.stdout, result.stdout


# -- replay ----------------------------------------------------------------------------------


def test_outbox_replay_sends_a_dead_letter_file_again_and_a_second_run_sends_nothing(tmp_path):
    path = tmp_path / "dead.jsonl"
    with Sink() as sink:
        # Too large for this outbox's batches: dead-lettered with their whole JSON.
        outbox = Outbox(
            HttpTransport(sink.url, mode="batch"), dead_letter=path, max_batch_bytes=2000, close_at_exit=False
        )
        for n in range(3):
            event = run_event(n=n)
            event["run"]["facets"] = {"x": {"_producer": "p", "_schemaURL": "s", "v": "x" * 3000}}
            outbox.emit(event)
        outbox.emit(run_event(n=9))
        report = outbox.close(10)
    assert report.undelivered == {"too_large": 3}, report
    assert len(path.read_text().splitlines()) == 3
    # Plain events in the same file are replayed too.
    with path.open("a") as file:
        file.write(json.dumps(run_event(n=7)) + "\n\n")
    with Sink() as fixed:  # replayed by an outbox with the default max_batch_bytes (1 MiB)
        first = replay(path, fixed.url, "--timeout", "10")
        again = replay(path, fixed.url, "--timeout", "10")
        arrived = sorted(e["n"] for e in fixed.events)
    assert first.returncode == 0, first.stderr
    assert f"replayed 4 events from {path}: delivered 4, none left undelivered" in first.stdout
    assert arrived == [0, 1, 2, 7]  # once: the second run found them recorded
    assert again.returncode == 0, again.stderr
    assert "replayed 0 events" in again.stdout
    assert "4 delivered by an earlier run, skipped" in again.stdout


def test_a_second_replay_sends_only_what_the_first_did_not_deliver(tmp_path):
    path = tmp_path / "dead.jsonl"
    events = [("rejected_by_backend", "400", orjson.dumps(run_event(n=n)), None) for n in range(40)]
    events += [("poison", "500", orjson.dumps(run_event(n=n, job="POISON")), None) for n in range(40, 50)]
    DeadLetter(path).write(events)
    with Sink(behaviour=SinkBehaviour(poison="POISON")) as sink:
        first = replay(path, sink.url, "--timeout", "20", env={"OUTBOX_POISON_ATTEMPTS": "1"})
        delivered_first = sorted(e["n"] for e in sink.events)
        sink.behaviour.poison = None  # the backend fixed
        second = replay(path, sink.url, "--timeout", "20")
        arrived = [e["n"] for e in sink.events]
    assert delivered_first == list(range(40))
    assert first.returncode == 1, first.stdout + first.stderr
    # Not "lost": what was not delivered stays in the file, and the second run sends it.
    assert f"delivered 40, 10 not delivered (poison: 10), left in {path} for the next run" in first.stdout
    assert "lost" not in first.stdout
    assert second.returncode == 0, second.stdout + second.stderr
    assert sorted(arrived) == list(range(50))  # every event once: no duplicates of the 40
    assert "replayed 10 events" in second.stdout
    assert "40 delivered by an earlier run" in second.stdout


def test_replay_keeps_its_deadline_whatever_the_buffer_size_and_the_next_run_sends_the_rest(tmp_path):
    path = tmp_path / "dead.jsonl"
    DeadLetter(path).write(records(0, 50))
    down = f"http://127.0.0.1:{refused_port()}"
    small = {"OUTBOX_MAX_EVENTS": "10", "OUTBOX_MAX_BATCH_EVENTS": "5"}
    started = time.monotonic()
    cut = replay(path, down, "--timeout", "3", env=small)
    took = time.monotonic() - started
    assert cut.returncode == 1, cut.stderr
    assert 3 <= took < 20  # used its time, and kept it (each event beyond 10 waited 60 s before)
    assert "40 not sent by the deadline (--timeout 3): run again to send them" in cut.stdout, cut.stdout
    # The wait said what it waited for, once, while it waited (on stderr).
    assert cut.stderr.count("outbox replay: still sending to HttpTransport(") == 1, cut.stderr
    assert "(--timeout 3) for it to take the events" in cut.stderr
    assert "dropped_shutdown" in cut.stdout
    with Sink() as sink:
        rest = replay(path, sink.url, "--timeout", "30", env=small)
        arrived = sorted(e["n"] for e in sink.events)
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert arrived == list(range(50))


def test_replay_refuses_to_run_without_a_configured_backend_unless_asked_for_the_console(tmp_path):
    path = tmp_path / "dead.jsonl"
    DeadLetter(path).write(records(0, 3))
    refused = replay(path)
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert "no lineage backend is configured: set OPENLINEAGE_URL" in refused.stderr
    assert "--console" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    disabled = replay(path, env={"OPENLINEAGE_DISABLED": "true"})
    assert disabled.returncode == 2
    assert "lineage is disabled" in disabled.stderr
    shown = replay(path, None, "--console")
    assert shown.returncode == 0, shown.stderr
    # Standard output is the events alone (for jq and the like); the summary is on stderr.
    printed = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [e["n"] for e in printed] == [0, 1, 2]
    assert "replayed 3 events" in shown.stderr
    assert not Path(str(path) + ".replayed").exists()  # a look at the file delivers nothing
    with Sink() as sink:
        assert replay(path, sink.url).returncode == 0
        assert len(sink.events) == 3


def test_replay_reads_a_file_written_before_records_had_a_frame(tmp_path):
    path = tmp_path / "old.jsonl"
    old = [
        {"time": "2026-12-02T10:00:00+00:00", "reason": "poison", "answer": "500", "event": run_event(n=n)}
        for n in range(3)
    ]
    lines = [orjson.dumps(r) for r in old]
    invalid = {
        "time": "2026-12-02T10:00:00+00:00",
        "reason": "invalid_event",
        "answer": "",
        "event_repr": "x",
    }
    # The old writer glued a record onto a torn one: the record is found again.
    glued = b'{"time":"2026-12-02T10:00:00+00:00","reason":"po' + orjson.dumps(
        {"time": "2026-12-02T10:00:01+00:00", "reason": "poison", "answer": "500", "event": run_event(n=3)}
    )
    path.write_bytes(b"\n".join([*lines, orjson.dumps(invalid), glued]) + b"\n")
    with Sink() as sink:
        result = replay(path, sink.url)
        arrived = sorted(e["n"] for e in sink.events)
    assert result.returncode == 0, result.stderr
    assert arrived == [0, 1, 2, 3]
    assert "1 torn record(s)" in result.stderr
    assert "1 record(s) hold no JSON event" in result.stdout


def test_replay_of_a_missing_file_or_an_unwritable_progress_is_a_short_error(tmp_path):
    missing = replay(tmp_path / "nope.jsonl", "http://127.0.0.1:9")
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr
    assert "Traceback" not in missing.stderr
    path = tmp_path / "dead.jsonl"
    DeadLetter(path).write(records(0, 1))
    elsewhere = replay(path, "http://127.0.0.1:9", "--progress", str(tmp_path / "no" / "such"))
    assert elsewhere.returncode == 2
    assert "give --progress PATH somewhere writable" in elsewhere.stderr


def test_a_fork_child_writes_even_if_a_parent_thread_held_the_counters_lock(tmp_path):
    path = tmp_path / "dead.jsonl"
    dead = DeadLetter(path)
    with dead._lock:  # as another thread of the parent might at the instant of the fork
        pid = os.fork()
        if pid == 0:
            try:
                dead.write(records(0, 1))
            finally:
                os._exit(0)
    deadline = time.monotonic() + 10
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    if done == (0, 0):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done[0] == pid, "the child hung on the inherited lock"
    assert events_of(read(path)) == [0]


def test_two_replays_of_one_file_at_once_the_second_refuses(tmp_path):
    import fcntl

    path = tmp_path / "dead.jsonl"
    DeadLetter(path).write(records(0, 1))
    with open(str(path) + ".replayed", "ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = replay(path, "http://127.0.0.1:9")
    assert result.returncode == 2
    assert "another outbox replay is recording into" in result.stderr
