"""Any openlineage-python transport behind the outbox.

The transports the outbox has no native equivalent for (``transform``, ``msk-iam``,
``amazon_datazone_api``, ``gcplineage``, ``datadog``, a custom ``module.Class``, a ``file``
transport writing to remote storage) are built by openlineage-python's own factory from the
same configuration, and their blocking ``emit`` runs on a few daemon threads the adapter owns,
never on the caller's: so each of them gains the outbox's buffering, batching, retries and
shutdown deadline.  An exception from ``emit`` is a retry; ``emit`` still running at the
deadline is a retry too (the call may yet complete: at least once); its text is logged without
the config's credentials, and not at all when it may quote a header (a credential).  A run's events are
emitted one after the other, in order; different runs go in parallel.

Each event is handed to ``emit`` as a plain dict (openlineage-python's ``Serde.to_json``
takes dicts as well as event objects); a transport that needs event objects (a ``transform``
with a transformer reading attributes) must read dict keys instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from .._config import ResolvedTransport
from .._errors import ConfigError
from .._log import RateLimitedLog
from .._threads import DaemonExecutor
from ._base import DELIVERED, Outcome, SerializedEvent
from ._http_settings import config_secrets, safe_failure

__all__ = ["OpenLineageTransportAdapter"]


class OpenLineageTransportAdapter:
    """Runs an openlineage-python ``Transport`` in the sidecar's place.

    Example::

        OpenLineageTransportAdapter.from_config(
            ResolvedTransport({"type": "my_package.MyTransport", "option": 1})
        )

    Args:
        factory: builds the openlineage-python transport (called again in a forked child).
        threads: how many ``emit`` calls may run at once (different runs).
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        threads: int = 4,
        description: str = "",
        secrets: Sequence[str] = (),
    ) -> None:
        self._factory = factory
        # The config's credentials: taken out of every error text this adapter logs.
        self._secrets = tuple(secrets)
        self.transport = factory()
        self.threads = threads
        self._description = description or type(self.transport).__name__
        self._executor: Any = None
        self._log = RateLimitedLog(30.0)

    @classmethod
    def from_config(cls, resolved: ResolvedTransport) -> OpenLineageTransportAdapter:
        """Build the transport openlineage-python builds for this configuration.

        Raises:
            ConfigError: openlineage-python cannot build it (naming the type and its error), or
                an API key, token or header value no HTTP header can carry (naming the setting).
        """
        from openlineage.client.transport import get_default_factory

        config = dict(resolved.config or {})
        kind = config.get("type")
        secrets = config_secrets(config, resolved.origin)

        def build() -> Any:
            return get_default_factory().create(dict(config))

        try:
            return cls(build, description=f"openlineage-python {kind}", secrets=secrets)
        except Exception as exc:
            raise ConfigError(
                f"{resolved.origin('type')}={kind!r}: openlineage-python could not build this transport: "
                f"{safe_failure(exc, secrets)}"
            ) from None

    def __repr__(self) -> str:
        return f"OpenLineageTransportAdapter({self._description})"

    def clone(self) -> OpenLineageTransportAdapter:
        """A fresh transport (for a forked child: the parent's threads do not exist there)."""
        return OpenLineageTransportAdapter(
            self._factory, threads=self.threads, description=self._description, secrets=self._secrets
        )

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = DaemonExecutor("outbox-openlineage-transport")
        runs: dict[Any, list[int]] = {}
        for index, event in enumerate(batch):
            runs.setdefault(event.run_id if event.run_id is not None else ("event", index), []).append(index)
        outcomes: list[Outcome] = [Outcome.deferred()] * len(batch)
        limit = asyncio.Semaphore(self.threads)

        async def one_run(indexes: list[int]) -> None:
            async with limit:
                for index in indexes:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        outcomes[index] = Outcome.retry(
                            "timeout", f"{self!r}: no time left before the deadline"
                        )
                        return
                    call = loop.run_in_executor(self._executor, self._emit, batch[index].body)
                    done, _ = await asyncio.wait({call}, timeout=remaining)
                    if not done:
                        outcomes[index] = Outcome.retry(
                            "timeout", f"{self!r}: emit took longer than {remaining:.3g} s"
                        )
                        return  # the run's later events wait (DEFERRED): order holds
                    failure = call.exception()
                    if failure is not None:
                        detail = f"{self!r}.emit raised {safe_failure(failure, self._secrets)}"
                        self._log.warning("emit", "%s; the events stay buffered", detail)
                        outcomes[index] = Outcome.retry("transport_error", detail)
                        return
                    outcomes[index] = DELIVERED

        await asyncio.gather(*(one_run(indexes) for indexes in runs.values()))
        return outcomes

    def _emit(self, body: bytes) -> None:
        self.transport.emit(orjson.loads(body))

    async def aclose(self) -> None:
        close = getattr(self.transport, "close", None)
        if callable(close) and self._executor is not None:
            loop = asyncio.get_running_loop()
            call = loop.run_in_executor(self._executor, close, 1.0)
            await asyncio.wait({call}, timeout=2.0)
