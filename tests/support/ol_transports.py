"""openlineage-python transports written as its users write them (``module.Class`` in the
config), for tests/unit/transports/test_openlineage_adapter.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import attr
from openlineage.client.serde import Serde
from openlineage.client.transport.http import TokenProvider
from openlineage.client.transport.transform import EventTransformer
from openlineage.client.transport.transport import Config, Transport

RECEIVED: list[dict[str, Any]] = []
LOCK = threading.Lock()


@attr.define
class RecordingConfig(Config):
    fail_first: int = 0  # emit raises this many times first
    delay: float = 0.0  # seconds each emit takes
    close_error: str = ""  # close raises RuntimeError(close_error) if set

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> RecordingConfig:
        return cls(
            fail_first=int(params.get("fail_first", 0)),
            delay=float(params.get("delay", 0.0)),
            close_error=str(params.get("close_error", "")),
        )


class RecordingTransport(Transport):
    kind = "recording"
    config_class = RecordingConfig

    def __init__(self, config: RecordingConfig) -> None:
        self.config = config
        self.failures_left = config.fail_first
        self.threads: set[str] = set()

    def emit(self, event: Any) -> None:
        self.threads.add(threading.current_thread().name)
        if self.config.delay:
            time.sleep(self.config.delay)
        with LOCK:
            if self.failures_left > 0:
                self.failures_left -= 1
                raise ConnectionError("backend unavailable")
            RECEIVED.append(Serde.to_dict(event))

    def close(self, timeout: float = -1) -> bool:
        if self.config.close_error:
            raise RuntimeError(self.config.close_error)
        return True


class RenameJob(EventTransformer):
    """A transform transport's transformer: it receives the event as a dict."""

    def transform(self, event: Any) -> Any:
        event["job"]["name"] = "renamed"
        return event


VAULT_TOKEN = "vault-TOKEN-7f3a9c"


class VaultTokenProvider(TokenProvider):
    """A token provider as users write one (``auth: {type: module.Class}``): the token it reads
    from a vault ends in a line break, which no HTTP header can carry, found only when sent."""

    def __init__(self, config: dict[str, str]) -> None:
        super().__init__(config)
        self.config = config

    def get_bearer(self) -> str | None:
        return f"Bearer {VAULT_TOKEN}\n"
