"""``OutboxTransport``: an openlineage-python ``Transport`` that routes an unchanged
``OpenLineageClient()`` through the outbox, selected by environment variables alone."""

from __future__ import annotations

import json
import os
from typing import Any

from openlineage.client.transport.transport import Config, Transport

from ._outbox import Outbox
from ._run._serde import serialize

__all__ = ["OutboxTransport"]


class OutboxConfig(Config):
    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> OutboxConfig:
        return cls(dict(params))


class OutboxTransport(Transport):
    """Select it with ``OPENLINEAGE__TRANSPORT__TYPE=outbox.OutboxTransport``.

    The real transport comes from ``OPENLINEAGE_URL`` (and ``OPENLINEAGE_ENDPOINT``,
    ``OPENLINEAGE_API_KEY``), or from ``OPENLINEAGE__TRANSPORT__DELEGATE__*`` (for example
    ``..._DELEGATE__TYPE=kafka``, ``..._DELEGATE__TOPIC``, ``..._DELEGATE__CONFIG``); the
    outbox's knobs from ``OUTBOX_*``.  ``emit`` hands the event to the outbox and returns at
    once; ``close`` (``OpenLineageClient.close``) closes it within its timeout.
    """

    kind = "outbox"
    config_class = OutboxConfig

    def __init__(self, config: OutboxConfig) -> None:
        from ._config._config import OUTBOX_VARIABLES
        from ._errors import ConfigError

        # "transports" is openlineage-python's own alias of OPENLINEAGE_URL, which we read directly.
        params = {
            k: v for k, v in config.params.items() if k not in ("type", "name", "priority", "transports")
        }
        delegate = params.pop("delegate", None)
        knobs = {keyword for keyword, _ in OUTBOX_VARIABLES.values()}
        unknown = sorted(set(params) - knobs)
        if unknown:
            raise ConfigError(
                f"OPENLINEAGE__TRANSPORT__{unknown[0].upper()}: {unknown[0]!r} is not an OutboxTransport "
                f"setting; it takes delegate (the real transport) and {', '.join(sorted(knobs))}"
            )
        # Our own variables describe this transport, not the one behind it: leave them out,
        # and the YAML file too, which would name this transport again.
        environ = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("OPENLINEAGE__TRANSPORT") and k != "OPENLINEAGE_CONFIG"
        }
        if isinstance(delegate, dict):
            environ["OPENLINEAGE__TRANSPORT"] = json.dumps(delegate)
        self.outbox = Outbox._from_environment(environ, params, read_files=False)

    def emit(self, event: Any) -> None:
        # openlineage-python's transports write the event inside emit, so code written for them
        # may change it afterwards (a list of inputs that START and COMPLETE share, appended to
        # between them): written here too, what is sent is the event as it was when emitted.
        # The client's own emit costs hundreds of µs an invocation; this, some 17 µs an event (the
        # serializer's events/s in docs/benchmarks.md).
        try:
            body = serialize(event).body
        except Exception:  # (not serializable: the outbox counts it invalid_event, naming why)
            self.outbox.emit(event)
            return
        self.outbox.emit(body)

    def close(self, timeout: float = -1) -> bool:
        report = self.outbox.close(None if timeout < 0 else timeout)
        return report.complete

    def __repr__(self) -> str:
        return f"OutboxTransport({self.outbox!r})"
