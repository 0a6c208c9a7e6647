"""Apache Kafka 4.x on loopback, for the end-to-end suite and the benchmarks that need the
reference broker (``python -m outbox.tools.benchmarks forward``).

The broker's jars are resolved from Maven Central with Maven (cached in the local Maven
repository and in ``$LINEAGE_OUTBOX_PEERS_CACHE``, default ``~/.cache/lineage-outbox``). One process
is broker and controller (KRaft), its storage formatted first, its log in a temporary folder
that survives a restart (``stop``/``kill``, then ``start`` on the same log).

Ready means serving, not listening: :meth:`ApacheKafka.start` returns once a Metadata request
answers with a broker and a controller among the brokers.  A port that accepts connections is
not yet a broker: a KRaft node listens before it has registered with its controller, and a
client that asks then gets metadata with no broker in it (aiokafka's admin client then fails
on a controller that is None).  Each long step says what it waits for first, through ``say``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from .broker import start_server, stop_process

__all__ = ["CACHE", "KAFKA_VERSION", "ApacheKafka", "maven_classpath", "metadata_answer", "wait_for_metadata"]

KAFKA_VERSION = "4.4.0"
CACHE = Path(os.environ.get("LINEAGE_OUTBOX_PEERS_CACHE", Path.home() / ".cache" / "lineage-outbox"))

Say = Callable[[str], None]

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>lineage-outbox.peers</groupId>
  <artifactId>{artifact}-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version></dependency>
  </dependencies>
</project>
"""


def say_to_stderr(line: str) -> None:
    print(f"[e2e set-up] {line}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def maven_classpath(group: str, artifact: str, version: str, say: Say = say_to_stderr) -> str:
    """The runtime jars of ``group:artifact:version`` and its dependencies, resolved once."""
    lib = CACHE / f"{artifact}-{version}" / "lib"
    done = lib.parent / "resolved"
    if not done.exists():
        if shutil.which("mvn") is None:
            raise RuntimeError("Apache Kafka here needs Maven (mvn) to resolve its jars")
        say(
            f"resolving {group}:{artifact}:{version} and its dependencies with Maven (a first run "
            f"downloads them from Maven Central, which can take minutes; kept in {lib})"
        )
        lib.parent.mkdir(parents=True, exist_ok=True)
        (lib.parent / "pom.xml").write_text(_POM.format(group=group, artifact=artifact, version=version))
        result = subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "-f",
                str(lib.parent / "pom.xml"),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={lib}",
                "-DincludeScope=runtime",
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"mvn could not resolve {group}:{artifact}:{version}:\n{result.stdout[-3000:]}"
            )
        done.write_text("ok\n")
    return f"{lib}/*"


async def _metadata(host: str, port: int, timeout: float) -> tuple[bool, str]:
    from aiokafka.conn import create_conn
    from aiokafka.protocol.metadata import MetadataRequest

    conn = await asyncio.wait_for(create_conn(host, port, request_timeout_ms=int(timeout * 1000)), timeout)
    try:
        answer = await asyncio.wait_for(conn.send(MetadataRequest([])), timeout)
    finally:
        conn.close()
    brokers = {int(broker[0]) for broker in answer.brokers}
    controller = int(getattr(answer, "controller_id", -1))
    ready = bool(brokers) and controller in brokers
    said = f"metadata with brokers {sorted(brokers) or 'none'} and controller {controller}"
    return ready, said


def metadata_answer(bootstrap: str, timeout: float = 5.0) -> tuple[bool, str]:
    """Ask ``bootstrap`` (``host:port``) for the cluster's metadata once: (True when it names at
    least one broker and a controller among them, what it answered in words).  A connection
    that fails or a request that times out is (False, what happened)."""
    from aiokafka.errors import KafkaError

    host, _, port = bootstrap.rpartition(":")
    try:
        return asyncio.run(_metadata(host, int(port), timeout))
    except (KafkaError, OSError, TimeoutError) as exc:
        return False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def wait_for_metadata(
    bootstrap: str,
    timeout: float,
    name: str = "Kafka",
    alive: Callable[[], bool] = lambda: True,
    log_tail: Callable[[], str] = lambda: "",
) -> None:
    """Wait until ``bootstrap`` answers a Metadata request with a broker and a controller.

    Raises:
        RuntimeError: not by ``timeout`` seconds, or ``alive()`` turned false; it names the
            peer, what it answered last, and ends with ``log_tail()``.
    """
    deadline = time.monotonic() + timeout
    last = "nothing yet"
    while True:
        ready, last = metadata_answer(bootstrap, timeout=max(0.5, min(5.0, deadline - time.monotonic())))
        if ready:
            return
        if not alive():
            raise RuntimeError(
                f"{name} on {bootstrap} exited before it served metadata; it last answered: "
                f"{last}{log_tail()}"
            )
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"{name} on {bootstrap} did not answer metadata with a broker and a controller within "
                f"{timeout:g} s; it last answered: {last}{log_tail()}"
            )
        time.sleep(0.1)


class ApacheKafka:
    """One KRaft node (broker and controller) on free loopback ports.

    Args:
        say: where each long step says what it waits for.
        properties: server properties added to (or replacing) the defaults below.
    """

    #: Started and stopped here (``KAFKA_BOOTSTRAP_SERVERS`` names one that is not: e2e's ExternalKafka).
    external = False

    def __init__(self, say: Say = say_to_stderr, properties: Mapping[str, str] | None = None) -> None:
        self.say = say
        self.port = _free_port()
        self.controller_port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-kafka-"))
        self.log_path = self.dir / "kafka.log"
        self.extra = dict(properties or {})
        self._process: subprocess.Popen[bytes] | None = None
        self._classpath = maven_classpath("org.apache.kafka", "kafka_2.13", KAFKA_VERSION, say)
        self._java = shutil.which("java") or "java"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _properties(self) -> Path:
        path = self.dir / "server.properties"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.dir / "data"),
            "num.partitions": "3",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
            **self.extra,
        }
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return path

    def start(self, timeout: float = 90.0) -> ApacheKafka:
        """Start (formatting the storage the first time) and return once the broker serves
        metadata with a broker and a controller, within ``timeout`` seconds in all."""
        properties = self._properties()
        if not (self.dir / "data").exists():
            self.say(f"formatting Kafka {KAFKA_VERSION}'s storage in {self.dir / 'data'} (two JVM starts)")
            cluster = (
                subprocess.run(
                    [self._java, "-cp", self._classpath, "kafka.tools.StorageTool", "random-uuid"],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            subprocess.run(
                [
                    self._java,
                    "-cp",
                    self._classpath,
                    "kafka.tools.StorageTool",
                    "format",
                    "--standalone",
                    "-t",
                    cluster,
                    "-c",
                    str(properties),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
        command = [self._java, "-Xmx512m", "-cp", self._classpath, "kafka.Kafka", str(properties)]
        self.say(
            f"starting Apache Kafka {KAFKA_VERSION}: waiting up to {timeout:g} s for it to listen on "
            f"{self.bootstrap_servers} and answer metadata with a broker and a controller "
            f"(log: {self.log_path})"
        )
        began = time.monotonic()
        process = start_server(command, self.port, str(self.log_path), timeout, "Kafka")
        self._process = process
        try:
            wait_for_metadata(
                self.bootstrap_servers,
                max(1.0, timeout - (time.monotonic() - began)),
                f"Apache Kafka {KAFKA_VERSION}",
                alive=lambda: process.poll() is None,
                log_tail=self._log_tail,
            )
        except BaseException:
            self._process = None
            stop_process(process, grace=5.0)
            raise
        return self

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_bytes()[-8192:].decode(errors="replace")
        except OSError:
            return ""
        return f"\nthe last lines of {self.log_path}:" + "".join(
            f"\n  {line}" for line in text.splitlines()[-lines:]
        )

    def stop(self) -> None:
        """A clean shutdown (SIGTERM); the log stays for the next start."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            self.say(f"stopping Apache Kafka on {self.bootstrap_servers}: up to 60 s for a clean shutdown")
        stop_process(process, grace=60.0)

    def kill(self) -> None:
        """A crash (SIGKILL): no clean shutdown; the log stays for the next start."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(30)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.remove()
