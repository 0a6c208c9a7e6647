"""Real peers for the end-to-end suite, installed and started on loopback.

Apache Kafka 4.x: the broker's jars resolved from Maven Central with Maven (cached in the
local Maven repository and in ``$OUTBOX_PEERS_CACHE``, default ``~/.cache/lineage-outbox``),
KRaft mode, one process as broker and controller, storage formatted first, logs kept in a
temporary folder that survives a restart; or any running Kafka named by
``KAFKA_BOOTSTRAP_SERVERS`` (which the suite then neither starts nor stops).

Marquez 0.51.1: through the scripts of ``../shared/peers/marquez`` beside the checkout (or
``$MARQUEZ_PEER_DIR``), which build it from its sources with Maven (cached) and run it with a
throwaway PostgreSQL on free loopback ports; or any running Marquez named by ``MARQUEZ_URL``
(which the suite then neither starts nor stops).

Each long step (resolving jars with Maven, building Marquez, starting and stopping a peer) says
what it waits for first, through ``say`` (the conftest passes one that reaches the terminal
past pytest's capture).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from outbox.tools.broker import start_server, stop_process

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


Say = Callable[[str], None]


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
            raise RuntimeError("the e2e suite needs Maven (mvn) to resolve the peers' jars")
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


class ExternalKafka:
    """The Kafka ``KAFKA_BOOTSTRAP_SERVERS`` names, started by the user: used as it is, never
    stopped or restarted (the tests that restart the broker are skipped)."""

    external = True

    def __init__(self, bootstrap_servers: str, say: Say = say_to_stderr) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.say = say

    def start(self, timeout: float = 30.0) -> ExternalKafka:
        """Check that the first server listens, so that a wrong address fails once, saying so."""
        host, _, port = self.bootstrap_servers.split(",")[0].strip().rpartition(":")
        self.say(f"using the Kafka at {self.bootstrap_servers} (KAFKA_BOOTSTRAP_SERVERS)")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        except (OSError, ValueError) as exc:
            raise RuntimeError(
                f"KAFKA_BOOTSTRAP_SERVERS={self.bootstrap_servers!r}: nothing answers there ({exc})"
            ) from None
        return self

    def remove(self) -> None:
        pass


class ApacheKafka:
    """One KRaft node (broker and controller) on free loopback ports."""

    external = False

    def __init__(self, say: Say = say_to_stderr) -> None:
        self.say = say
        self.port = _free_port()
        self.controller_port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-kafka-"))
        self.log_path = self.dir / "kafka.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._classpath = maven_classpath("org.apache.kafka", "kafka_2.13", KAFKA_VERSION, say)
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
            f"{self.bootstrap_servers} (log: {self.log_path})"
        )
        self._process = start_server(command, self.port, str(self.log_path), timeout, "Kafka")
        return self

    def stop(self) -> None:
        """A clean shutdown (SIGTERM); the logs stay for the next start."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            self.say(f"stopping Apache Kafka on {self.bootstrap_servers}: up to 60 s for a clean shutdown")
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


MARQUEZ_SCRIPTS = Path(
    os.environ.get("MARQUEZ_PEER_DIR", Path(__file__).resolve().parents[3] / "shared" / "peers" / "marquez")
)


class Marquez:
    """A Marquez for the suite: started by the peer scripts in a run directory of its own, or
    the one ``MARQUEZ_URL`` names (``external``: never stopped or restarted by the suite)."""

    def __init__(self, say: Say = say_to_stderr) -> None:
        self.say = say
        self.external = os.environ.get("MARQUEZ_URL")
        self.url = self.external or ""
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-marquez-"))
        self.log_path = self.dir / "marquez.log"
        self._ports: dict[str, str] = {}

    @staticmethod
    def available() -> bool:
        return bool(os.environ.get("MARQUEZ_URL")) or (MARQUEZ_SCRIPTS / "start.sh").exists()

    def _script(self, name: str, *args: str, timeout: float = 600) -> None:
        env = {**os.environ, "MARQUEZ_RUN_DIR": str(self.dir), **self._ports}
        result = subprocess.run(
            ["bash", str(MARQUEZ_SCRIPTS / name), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{MARQUEZ_SCRIPTS / name} failed ({result.returncode}):\n{result.stdout[-2000:]}\n"
                f"{result.stderr[-3000:]}\n{self.log_tail()}"
            )

    def start(self) -> Marquez:
        if self.external:
            self.wait_ready(60)
            return self
        if not self._ports:
            self._ports = {
                "MARQUEZ_PORT": str(_free_port()),
                "MARQUEZ_ADMIN_PORT": str(_free_port()),
                "MARQUEZ_PG_PORT": str(_free_port()),
            }
            self.say(
                f"building Marquez 0.51.1 with {MARQUEZ_SCRIPTS / 'build.sh'} (from its sources with "
                "Maven: minutes the first time, then cached; up to 600 s)"
            )
            self._script("build.sh")
        self.say(f"starting Marquez and its PostgreSQL with {MARQUEZ_SCRIPTS / 'start.sh'} (up to 600 s)")
        self._script("start.sh")
        env = dict(line.split("=", 1) for line in (self.dir / "env").read_text().splitlines() if "=" in line)
        self.url = env["MARQUEZ_URL"]
        # The same ports on a restart (start.sh takes the next free one only if these are taken).
        self._ports["MARQUEZ_PORT"] = self.url.rsplit(":", 1)[1]
        self._ports["MARQUEZ_PG_PORT"] = env["MARQUEZ_PG_PORT"]
        self.wait_ready(60)
        return self

    def stop(self) -> None:
        """Marquez and its PostgreSQL stop; the database stays for the next start."""
        if not self.external:
            self.say(f"stopping Marquez and its PostgreSQL with {MARQUEZ_SCRIPTS / 'stop.sh'} (up to 120 s)")
            self._script("stop.sh", timeout=120)

    def remove(self, keep_logs: bool) -> None:
        if self.external:
            return
        self.stop()
        if not keep_logs:
            shutil.rmtree(self.dir, ignore_errors=True)

    def wait_ready(self, timeout: float) -> None:
        self.say(f"waiting up to {timeout:g} s for Marquez at {self.url} to answer")
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/api/v1/namespaces", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Marquez at {self.url} did not answer in {timeout:.0f} s\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def get(self, path: str, **params: Any) -> Any:
        answer = httpx.get(f"{self.url}{path}", params=params, timeout=30)
        answer.raise_for_status()
        return answer.json()
