"""Real peers for the end-to-end suite, installed and started on loopback, each used only
once it answers its own protocol (not once its port is open).

Apache Kafka 4.x (``outbox.tools.apache_kafka``): the broker's jars resolved from Maven Central
with Maven (cached in the local Maven repository and in ``$LINEAGE_OUTBOX_PEERS_CACHE``, default
``~/.cache/lineage-outbox``), KRaft mode, one process as broker and controller, storage
formatted first, logs kept in a temporary folder that survives a restart; ready once a Metadata
request names a broker and a controller; or any running Kafka named by ``KAFKA_BOOTSTRAP_SERVERS``
(which the suite then neither starts nor stops).

Marquez 0.51.1: through the scripts of ``../shared/peers/marquez`` beside the checkout (or
``$MARQUEZ_PEER_DIR``), which build it from its sources with Maven (cached) and run it with a
throwaway PostgreSQL on free loopback ports; or any running Marquez named by ``MARQUEZ_URL``
(which the suite then neither starts nor stops); ready once its API lists namespaces.

``outbox sink`` (``serving``): ready once it answers an HTTP request.

Each long step (resolving jars with Maven, building Marquez, starting and stopping a peer) says
what it waits for first, through ``say`` (the conftest passes one that reaches the terminal
past pytest's capture).  A peer that is not ready in time is an error naming it and what it
answered last.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from outbox.tools.apache_kafka import (  # noqa: F401 - the suite's names for them
    CACHE,
    KAFKA_VERSION,
    ApacheKafka,
    maven_classpath,
    say_to_stderr,
)
from outbox.tools.sink import Sink

Say = Callable[[str], None]


def _free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range: one the kernel hands out
    (bind to 0) was taken again, by a neighbouring suite's outgoing connection, before Marquez
    bound it ("Failed to bind to /127.0.0.1:39855", once beside the other suites)."""
    for _ in range(200):
        port = random.randrange(20_000, 32_768)  # (the ephemeral range begins at 32768 here)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_http(name: str, url: str, timeout: float, log_tail: Callable[[], str] = lambda: "") -> None:
    """Wait until a GET of ``url`` answers 200.

    Raises:
        RuntimeError: not by ``timeout`` seconds; it names the peer, the URL and what it
            answered last (a status and the start of its body, or the connection's error).
    """
    deadline = time.monotonic() + timeout
    last = "nothing yet"
    while True:
        try:
            answer = httpx.get(url, timeout=max(0.5, min(5.0, deadline - time.monotonic())))
            if answer.status_code == 200:
                return
            last = f"{answer.status_code} {answer.text[:200]!r}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"{name} did not answer GET {url} with 200 within {timeout:g} s; it last answered: "
                f"{last}{log_tail()}"
            )
        time.sleep(0.2)


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


@contextlib.contextmanager
def serving(sink: Sink, timeout: float = 30.0) -> Iterator[Sink]:
    """``sink`` started, and used once it answers HTTP (its list of events); stopped after."""
    with sink:
        wait_for_http("outbox sink", f"{sink.url}/api/v1/events", timeout)
        yield sink


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
        """Until Marquez answers an API call (its namespaces), within ``timeout`` seconds."""
        self.say(f"waiting up to {timeout:g} s for Marquez at {self.url} to answer")
        wait_for_http("Marquez", f"{self.url}/api/v1/namespaces", timeout, lambda: f"\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def get(self, path: str, **params: Any) -> Any:
        answer = httpx.get(f"{self.url}{path}", params=params, timeout=30)
        answer.raise_for_status()
        return answer.json()
