"""Real peers for the end-to-end suite, installed and started on loopback.

Apache Kafka 4.x: the broker's jars resolved from Maven Central with Maven (cached in the
local Maven repository and in ``$OUTBOX_PEERS_CACHE``, default ``~/.cache/lineage-outbox``),
KRaft mode, one process as broker and controller, storage formatted first, logs kept in a
temporary folder that survives a restart.

Marquez is not here: its artifacts (``io.github.marquezproject:marquez-api``) are not
served by the package registries this project can reach (every version answered 404).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from outbox.broker import start_server, stop_process

KAFKA_VERSION = "4.4.0"
CACHE = Path(os.environ.get("OUTBOX_PEERS_CACHE", Path.home() / ".cache" / "lineage-outbox"))

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def maven_classpath(group: str, artifact: str, version: str) -> str:
    """The runtime jars of ``group:artifact:version`` and its dependencies, resolved once."""
    lib = CACHE / f"{artifact}-{version}" / "lib"
    done = lib.parent / "resolved"
    if not done.exists():
        if shutil.which("mvn") is None:
            raise RuntimeError("the e2e suite needs Maven (mvn) to resolve the peers' jars")
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


class ApacheKafka:
    """One KRaft node (broker and controller) on free loopback ports."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.controller_port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-kafka-"))
        self.log_path = self.dir / "kafka.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._classpath = maven_classpath("org.apache.kafka", "kafka_2.13", KAFKA_VERSION)
        self._java = shutil.which("java") or "java"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _properties(self) -> Path:
        path = self.dir / "server.properties"
        path.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={self.dir / 'data'}",
                    "num.partitions=3",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=true",
                ]
            )
            + "\n"
        )
        return path

    def start(self, timeout: float = 90.0) -> ApacheKafka:
        properties = self._properties()
        if not (self.dir / "data").exists():
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
        self._process = start_server(command, self.port, str(self.log_path), timeout, "Kafka")
        return self

    def stop(self) -> None:
        """A clean shutdown (SIGTERM); the logs stay for the next start."""
        process, self._process = self._process, None
        stop_process(process, grace=60.0)

    def kill(self) -> None:
        """A crash (SIGKILL): no clean shutdown; the logs stay for the next start."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(30)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
