"""``python -m outbox.tools.benchmarks forward``: ``outbox forward`` at scale, on Apache Kafka.

Apache Kafka 4.x (one KRaft node, started here from its jars as the e2e suite starts it, or
the one ``--bootstrap-servers`` names), a topic of ``--partitions`` (12) partitions, and a
does-no-work HTTP server (``nullserver --keep``, a process of its own).

Throughput, for each count of ``--forwarders`` (1, 2 and 4): ``--events`` events produced to
a topic of their own (this process, aiokafka, acks=all), then that many ``outbox forward``
processes started in a group of their own.  The broker started here holds a new group back 3 s
(``group.initial.rebalance.delay.ms``), so that the forwarders join one generation rather than
the first taking every partition before the others arrive.  The figure is every arrival over
the time from the server's first arrival to its last (the server's clock), the median of
``--repeat`` runs; each run checks that every event arrived.

A forwarder killed: ``--kill-forwarders`` (2) forwarders, and once one of them has delivered a
third of its share (mid-stream, whatever the rate), the server takes its next request and
never answers it, and it gets SIGKILL while it waits: the worst moment, a whole poll's records
delivered and not committed (killed as soon as the server had counted its third, it had always
just committed, and its own records cost no copy).  Its partitions wait for the group's
session to expire (``--session-timeout``), then the others resume each at the group's
committed offset.  What the run checks:

* nothing lost: every event produced arrived at least once;
* duplicates bounded by what was uncommitted: a copy is sent only for a record delivered but
  not yet committed when its partition changed hands.  The killed forwarder's share of that
  is measured exactly (the server knows each request's sender by its bearer token, and the
  committed offsets are read once it is dead, before anyone else owns its partitions): every
  copy of its records is of one it delivered at or past its partition's committed offset.
  The others lose their partitions too when the group rebalances, with what they delivered of
  the poll in hand not yet committed: at most one poll each (``max_records``, 1000).  So the
  run checks copies of the killed forwarder's records <= its uncommitted records, and all
  copies <= that + 1000 x the surviving forwarders.

Figures depend on the machine and what else runs on it: the command prints them with the
CPU count; compare figures of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

#: Records per poll of ``outbox forward`` (``Forwarder.max_records``' default): the most one
#: forwarder delivers before it commits.
MAX_RECORDS = 1000


def say(line: str) -> None:
    print(f"[forward bench] {line}", file=sys.stderr, flush=True)


class NullServer:
    """``nullserver --keep`` in a process of its own."""

    def __enter__(self) -> NullServer:
        command = [sys.executable, "-m", "outbox.tools.benchmarks.nullserver", "--keep"]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        banner = self.process.stdout.readline()
        match = re.search(r" on (http://[^\s:]+:\d+)", banner)
        if match is None:
            self.process.kill()
            raise RuntimeError(f"the does-no-work server did not start: {banner!r}")
        self.url = match.group(1)
        httpx.get(f"{self.url}/count", timeout=30).raise_for_status()  # answers: ready
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(10)

    def count(self) -> dict[str, Any]:
        counts: dict[str, Any] = httpx.get(f"{self.url}/count", timeout=30).json()
        return counts

    def hold(self, who: str, after: int = 0) -> None:
        """Once ``who``'s requests carried ``after`` events, take its requests and never answer
        them (the server decides as each comes: none slips by between a look and the hold)."""
        httpx.get(f"{self.url}/hold/{who}/{after}", timeout=30).raise_for_status()

    def arrivals(self) -> list[tuple[float, str, int]]:
        """Every event that arrived, in arrival order: (time, sender, its number ``n``)."""
        text = httpx.get(f"{self.url}/bodies", timeout=120).content
        arrived = []
        for line in text.splitlines():
            at, who, body = line.split(b"\t", 2)
            events = orjson.loads(body)
            for event in events if isinstance(events, list) else [events]:
                arrived.append((float(at), who.decode(), int(event["n"])))
        return arrived


def _event(n: int, run_id: str, partition: int) -> bytes:
    """A COMPLETE event of a run, with one input and one output, numbered ``n``."""
    return orjson.dumps(
        {
            "eventType": "COMPLETE",
            "eventTime": "2026-12-02T10:00:00.000000+00:00",
            "producer": "https://github.com/lineage-outbox/benchmarks/forward",
            "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
            "run": {"runId": run_id, "facets": {}},
            "job": {"namespace": "vast-dataengine://bench", "name": f"forward.p{partition}", "facets": {}},
            "inputs": [{"namespace": "s3://bench-src", "name": f"in/{n}.csv", "facets": {}}],
            "outputs": [{"namespace": "s3://bench-dst", "name": f"out/{n}.csv", "facets": {}}],
            "n": n,
        }
    )


async def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()


async def _produce(
    bootstrap: str, topic: str, numbers: range, partitions: int, runs: Sequence[str]
) -> dict[int, tuple[int, int]]:
    """The events ``numbers``, event ``n`` to partition ``n % partitions`` (as a COMPLETE of
    ``runs[partition]``); where each landed: ``n -> (partition, offset)``."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, max_batch_size=256 * 1024
    )
    await producer.start()
    placed: dict[int, tuple[int, int]] = {}
    try:
        sent = []
        for partition in range(partitions):
            mine = [n for n in numbers if n % partitions == partition]
            position = 0
            while position < len(mine):
                batch, members = producer.create_batch(), []
                while position < len(mine):
                    n = mine[position]
                    if (
                        batch.append(key=None, value=_event(n, runs[partition], partition), timestamp=None)
                        is None
                    ):
                        break
                    members.append(n)
                    position += 1
                sent.append(
                    (partition, members, await producer.send_batch(batch, topic, partition=partition))
                )
        for partition, members, future in sent:
            base = (await future).offset
            for index, n in enumerate(members):
                placed[n] = (partition, base + index)
    finally:
        await producer.stop()
    return placed


async def _group(bootstrap: str, group: str) -> tuple[str, dict[str, list[int]]]:
    """The group's state and each member's partitions, by client id."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [answer] = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    [described] = answer.to_object()["groups"]
    members = {}
    for member in described["members"]:
        assignment = member["member_assignment"]
        owned = ConsumerProtocolMemberAssignment.decode(assignment).partitions() if assignment else []
        members[member["client_id"]] = sorted(tp.partition for tp in owned)
    return str(described["state"]), members


def wait_for_group(
    bootstrap: str, group: str, members: int, partitions: int, timeout: float
) -> dict[str, list[int]]:
    """Until the group is stable with ``members`` members owning every partition."""
    deadline = time.monotonic() + timeout
    state, owners = "unknown", dict[str, list[int]]()
    while time.monotonic() < deadline:
        try:
            state, owners = asyncio.run(_group(bootstrap, group))
        except Exception as exc:  # the coordinator still loading, say: ask again
            state = f"{type(exc).__name__}: {exc}"
        if state == "Stable" and len(owners) == members and sum(map(len, owners.values())) == partitions:
            return owners
        time.sleep(0.1)
    raise RuntimeError(f"the group {group} did not settle in {timeout:g} s: {state}, members {owners}")


async def _committed(bootstrap: str, group: str) -> dict[int, int]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items()}


def _forwarder(name: str, bootstrap: str, topic: str, group: str, url: str, session: float, log: Path) -> Any:
    command = [
        sys.executable,
        "-m",
        "outbox.tools.cli",
        "forward",
        "--bootstrap-servers",
        bootstrap,
        "--topic",
        topic,
        "--group-id",
        group,
        "--url",
        url,
        "--mode",
        "batch",
        "--api-key",
        name,  # the server tells the senders apart by it
        "--kafka-config",
        json.dumps({"client.id": name}),
        "--session-timeout",
        str(session),
        "--progress-interval",
        "0",
    ]
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


@dataclass
class Run:
    forwarders: int
    events: int
    produce_s: float = 0.0
    seconds: float = 0.0
    per_s: float = 0.0
    arrivals: int = 0
    #: Arrivals before this process saw the group stable (it asks every 0.1 s).
    before_stable: int = 0
    lost: int = 0
    duplicates: int = 0
    #: The kill: partitions of the killed forwarder, its records delivered at or past their
    #: committed offset (its uncommitted ones), the copies of those, and the bound checked.
    killed_partitions: list[int] = field(default_factory=list)
    uncommitted_at_kill: int = 0
    #: Records of its partitions at or past their committed offsets when it was killed,
    #: delivered or not: what the others resumed (0: it was not killed mid-stream).
    left_at_kill: int = 0
    copies_of_uncommitted: int = 0
    copies_of_others: int = 0
    bound: int = 0


Placed = dict[int, tuple[int, int]]  # event n -> (partition, offset)
Arrival = tuple[float, str, int]  # (time, sender, event n)


def forward_run(
    bootstrap: str,
    forwarders: int,
    events: int,
    partitions: int,
    session: float,
    kill: bool = False,
    timeout: float = 600.0,
) -> Run:
    """One run: ``events`` produced to a topic of their own, then ``forwarders`` processes
    in a group of their own forward them; with ``kill``, one of them gets SIGKILL while the
    server holds the answer to its request, once it has delivered a third of its share."""
    tag = uuid.uuid4().hex[:8]
    topic, group = f"forward-bench-{tag}", f"forward-bench-{tag}"
    asyncio.run(_create_topic(bootstrap, topic, partitions))
    logs = Path(tempfile.mkdtemp(prefix="outbox-forward-bench-"))
    run = Run(forwarders, events)
    began = time.monotonic()
    runs = [str(uuid.uuid4()) for _ in range(partitions)]
    placed = asyncio.run(_produce(bootstrap, topic, range(events), partitions, runs))
    run.produce_s = time.monotonic() - began
    with NullServer() as server:
        names = [f"forwarder-{i}" for i in range(forwarders)]
        processes = {
            name: _forwarder(name, bootstrap, topic, group, server.url, session, logs / f"{name}.log")
            for name in names
        }
        try:
            owners = wait_for_group(bootstrap, group, forwarders, partitions, timeout=120)
            stable = time.monotonic()
            deadline = time.monotonic() + timeout
            committed: dict[int, int] = {}
            if kill:
                run.killed_partitions = owners[names[0]]
                _kill_mid_stream(server, processes[names[0]], names[0], placed, run, deadline)
                committed = asyncio.run(_committed(bootstrap, group))
            arrived = _all_arrived(server, events, deadline, logs)
        finally:
            _stop(processes.values())
    shutil.rmtree(logs, ignore_errors=True)  # kept only when a run failed (its errors name it)
    _tally(run, arrived, stable)
    if kill:
        _tally_kill(run, arrived, placed, committed, names[0])
    return run


def _kill_mid_stream(
    server: NullServer, process: Any, victim: str, placed: Placed, run: Run, deadline: float
) -> None:
    """Once ``victim`` has delivered a third of its share (mid-stream, whatever the rate),
    its next request is taken and never answered, and it is killed waiting for the answer:
    the worst moment, a whole poll's records delivered and not committed.  Returns once it
    is dead: nobody owns its partitions until its session expires, so their committed
    offsets stay as it left them (the caller reads them then)."""
    share = sum(1 for p, _ in placed.values() if p in run.killed_partitions)
    # (Held by the server once a third has come: between a look here and a hold, the victim
    # could send its last request, and the run would wait for one that never comes.)
    server.hold(victim, after=-(-share // 3))
    while not server.count()["held"]:
        if time.monotonic() > deadline:
            delivered = server.count()["by"].get(victim, 0)
            raise RuntimeError(
                f"{victim} delivered {delivered:,} of its share of {share:,}, then nothing more in time"
            )
        time.sleep(0.01)
    process.kill()
    process.wait()


def _all_arrived(server: NullServer, events: int, deadline: float, logs: Path) -> list[Arrival]:
    """Until every one of ``events`` arrived at least once: the arrivals."""
    while True:
        if server.count()["events"] >= events:
            arrived = server.arrivals()
            if len({n for _, _, n in arrived}) >= events:
                return arrived
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{server.count()['events']:.0f} of {events} events arrived in time; "
                f"the forwarders' output is in {logs}"
            )
        time.sleep(0.1)


def _stop(processes: Iterable[Any]) -> None:
    """SIGTERM (a forwarder drains and commits), then SIGKILL after 30 s."""
    alive = [process for process in processes if process.poll() is None]
    for process in alive:
        process.send_signal(signal.SIGTERM)
    for process in alive:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _tally(run: Run, arrived: list[Arrival], stable: float) -> None:
    """The rate: every arrival, over the time from the first to the last (the server's
    clock).  The broker started here holds a new group back until its members have joined:
    nothing is consumed before every forwarder owns its share."""
    times = [at for at, _, _ in arrived]
    run.seconds = max(times) - min(times)
    run.per_s = len(arrived) / run.seconds if run.seconds > 0 else 0.0
    run.before_stable = sum(1 for at in times if at < stable)
    run.arrivals = len(arrived)
    copies = Counter(n for _, _, n in arrived)
    run.lost = run.events - len(copies)
    run.duplicates = run.arrivals - len(copies)


def _tally_kill(
    run: Run, arrived: list[Arrival], placed: Placed, committed: dict[int, int], victim: str
) -> None:
    """What the kill left uncommitted, and the copies of it."""
    copies = Counter(n for _, _, n in arrived)

    def uncommitted(n: int) -> bool:
        partition, offset = placed[n]
        return partition in run.killed_partitions and offset >= committed.get(partition, 0)

    delivered = {n for _, who, n in arrived if who == victim and uncommitted(n)}
    run.uncommitted_at_kill = len(delivered)
    run.left_at_kill = sum(1 for n in placed if uncommitted(n))
    run.copies_of_uncommitted = sum(copies[n] - 1 for n in delivered)
    run.copies_of_others = run.duplicates - run.copies_of_uncommitted
    run.bound = run.uncommitted_at_kill + MAX_RECORDS * (run.forwarders - 1)


def check(run: Run) -> list[str]:
    """What a run got wrong (nothing: an empty list)."""
    wrong = []
    if run.lost:
        wrong.append(f"{run.lost} event(s) lost")
    if run.killed_partitions:
        if not run.left_at_kill:
            wrong.append(
                "the forwarder was killed once its share was done, not mid-stream (on a broker that "
                "does not hold a new group back, group.initial.rebalance.delay.ms, the first member "
                "forwards everything before the second joins)"
            )
        if run.copies_of_uncommitted > run.uncommitted_at_kill:
            wrong.append(
                f"{run.copies_of_uncommitted} copies of the killed forwarder's "
                f"{run.uncommitted_at_kill} uncommitted records"
            )
        if run.duplicates > run.bound:
            wrong.append(f"{run.duplicates} duplicates, over the bound of {run.bound}")
    return wrong


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m outbox.tools.benchmarks forward", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--events", type=int, default=200_000, help="events per run (default 200,000)")
    parser.add_argument(
        "--forwarders",
        type=int,
        nargs="*",
        default=[1, 2, 4],
        help="forwarders per throughput run (default 1 2 4; none: only the kill)",
    )
    parser.add_argument("--partitions", type=int, default=12, help="the topic's partitions (default 12)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each count, the median printed (3)")
    parser.add_argument(
        "--kill-forwarders",
        type=int,
        default=2,
        help="forwarders in the run where one is killed with SIGKILL (default 2; 0: no such run)",
    )
    parser.add_argument(
        "--session-timeout",
        type=float,
        default=6.0,
        help="the forwarders' group session in seconds (default 6, Kafka's least by default)",
    )
    parser.add_argument(
        "--run-timeout",
        type=float,
        default=600.0,
        help="seconds a run may take once its group settled before it fails, naming what it waited for "
        "(default 600)",
    )
    parser.add_argument(
        "--bootstrap-servers", help="a running Kafka (default: start Apache Kafka here, from its jars)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    logging_quiet()
    if hasattr(sys.stdout, "reconfigure"):  # each line as it is printed, into a file too
        sys.stdout.reconfigure(line_buffering=True)
    if args.bootstrap_servers:
        return _report(args, args.bootstrap_servers, "the Kafka at " + args.bootstrap_servers)
    from outbox.tools.apache_kafka import KAFKA_VERSION, ApacheKafka

    # New groups wait up to 3 s for their members (each join within it extends the wait,
    # up to the rebalance timeout): the forwarders of a run join one generation together,
    # rather than the first taking every partition and the others taking theirs over.
    with ApacheKafka(say, properties={"group.initial.rebalance.delay.ms": "3000"}) as kafka:
        return _report(args, kafka.bootstrap_servers, f"Apache Kafka {KAFKA_VERSION} (one KRaft node, here)")


def logging_quiet() -> None:
    import logging

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


def _report(args: argparse.Namespace, bootstrap: str, broker: str) -> int:
    size = len(_event(args.events, str(uuid.uuid4()), 0))
    print(
        f"outbox forward at scale: {broker}, a topic of {args.partitions} partitions holding "
        f"{args.events:,} events\nof about {size} bytes, forwarded in batch mode into a does-no-work HTTP "
        f"server (its own process);\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the "
        "start\n"
    )
    figures: dict[str, Any] = {"events": args.events, "partitions": args.partitions, "throughput": {}}
    failed = _report_throughput(args, bootstrap, figures)
    if args.kill_forwarders:
        failed += _report_kill(args, bootstrap, figures)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)
    for wrong in failed:
        print(f"FAILED: {wrong}")
    return 1 if failed else 0


def _report_throughput(args: argparse.Namespace, bootstrap: str, figures: dict[str, Any]) -> list[str]:
    if args.forwarders:
        print("forwarders   events/s (median)   each run")
    failed = []
    for count in args.forwarders:
        runs = []
        for _ in range(args.repeat):
            run = forward_run(
                bootstrap, count, args.events, args.partitions, args.session_timeout, timeout=args.run_timeout
            )
            failed += [f"{count} forwarder(s): {wrong}" for wrong in check(run)]
            runs.append(run)
        rates = [r.per_s for r in runs]
        figures["throughput"][count] = {
            "median_per_s": statistics.median(rates),
            "runs": [asdict(r) for r in runs],
        }
        # Copies without a kill come from a rebalance mid-run (a member late to join): at
        # least once allows them; they are shown, not failed.  So are events forwarded before
        # the group settled (a broker that does not hold a new group back).
        each = ", ".join(
            f"{r.per_s:,.0f}"
            + (f" ({r.duplicates:,} copies)" if r.duplicates else "")
            + (f" ({r.before_stable:,} before the group settled)" if r.before_stable else "")
            for r in runs
        )
        print(f"  {count:<10}{statistics.median(rates):>12,.0f}          {each}")
    return failed


def _report_kill(args: argparse.Namespace, bootstrap: str, figures: dict[str, Any]) -> list[str]:
    print(
        f"\n{args.kill_forwarders} forwarders, one killed with SIGKILL once it had delivered a third of "
        "its share, while\nthe server held the answer to its next request (its partitions resumed by "
        f"the other(s) once its\n{args.session_timeout:g} s session expired); per run:"
    )
    failed, killed = [], []
    for _ in range(args.repeat):
        run = forward_run(
            bootstrap,
            args.kill_forwarders,
            args.events,
            args.partitions,
            args.session_timeout,
            kill=True,
            timeout=args.run_timeout,
        )
        killed.append(run)
        failed += [f"the kill: {wrong}" for wrong in check(run)]
        print(
            f"  run {len(killed)}: lost {run.lost or 'none'}; duplicates {run.duplicates:,} of "
            f"{run.arrivals:,} arrivals; {run.seconds:.1f} s from the first arrival to the last\n"
            f"    the killed forwarder's {len(run.killed_partitions)} partitions: {run.left_at_kill:,} "
            f"records not committed at the kill, {run.uncommitted_at_kill:,} of them delivered, "
            f"copies of those {run.copies_of_uncommitted:,}\n"
            f"    copies of the other records {run.copies_of_others:,}; all copies {run.duplicates:,} <= "
            f"bound {run.bound:,}: {'met' if run.duplicates <= run.bound else 'NOT met'}"
        )
    figures["killed"] = [asdict(run) for run in killed]
    print(
        f"  (bound: the killed forwarder's uncommitted records + {MAX_RECORDS:,}, one poll, per "
        "surviving forwarder)"
    )
    return failed
