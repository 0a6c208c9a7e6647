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
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from .._config._config import ResolvedTransport
from .._errors import ConfigError
from .._observability._log import RateLimitedLog
from .._runtime._threads import DaemonExecutor, read_when_done
from ._base import DELIVERED, Outcome, SerializedEvent
from ._http._settings import config_secrets, safe_failure

__all__ = ["OpenLineageTransportAdapter"]

# The adapter answers this long before the worker's deadline at most (the worker cancels a
# send at its deadline, and a cancelled send's outcomes are lost) ...
_MARGIN = 0.25
# ... or this share of the time it was given, if less.
_MARGIN_SHARE = 0.2
# Events whose emit returned but whose answer the worker has not had, remembered at most.
_MAX_REMEMBERED = 100_000
# While an emit runs, the adapter looks this often whether a close moved its deadline.
_LOOK_AGAIN = 0.05
_INF = float("inf")
# What the transport's own close may take at the outbox's close.
_CLOSE_WITHIN = 2.0


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
        self._lock = threading.Lock()
        #: Events whose emit returned, by identity, until a round answers them (the worker
        #: sends the same object again after a round that was cut).
        self._returned: dict[int, SerializedEvent] = {}
        #: Emits still running, by the event's identity.
        self._running: dict[int, tuple[SerializedEvent, concurrent.futures.Future[None]]] = {}
        #: Seconds one emit is expected to take (learned).
        self._expected = 0.0
        #: The close's deadline, once it began (begin_close).
        self._closing_by = _INF
        #: The most time a round was given (an emit expected to take longer fits no round).
        self._widest = 0.0

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
        secrets = config_secrets(config, resolved.named)

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
        """Emit the batch's events, each run's in order, runs in parallel, and return a little
        before ``deadline`` (the worker cancels at it: what it cancels is lost to it).  Only
        the emits expected to end in time are started; the rest are DEFERRED (sent again at
        once, not a failure).  An event whose ``emit`` returned is never emitted again: if its
        answer did not reach the worker (the round was cut), the next round answers it at once."""
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = DaemonExecutor("outbox-openlineage-transport")
        now = time.monotonic()
        # Our own deadline, with a margin before the worker's (a loop under load is late).
        own = deadline - min(_MARGIN, _MARGIN_SHARE * max(0.0, deadline - now))
        self._widest = max(self._widest, own - now)
        runs: dict[Any, list[int]] = {}
        for index, event in enumerate(batch):
            runs.setdefault(event.run_id if event.run_id is not None else ("event", index), []).append(index)
        outcomes: list[Outcome] = [Outcome.deferred()] * len(batch)
        limit = asyncio.Semaphore(self.threads)
        started = [False]

        async def one_run(indexes: list[int]) -> None:
            async with limit:
                for index in indexes:
                    outcome = await self._one(loop, batch[index], own, started)
                    if outcome is None:
                        return  # not started: this and the run's later events are DEFERRED
                    outcomes[index] = outcome
                    if outcome is not DELIVERED:
                        return  # the run's later events wait (DEFERRED): order holds

        await asyncio.gather(*(one_run(indexes) for indexes in runs.values()))
        return outcomes

    async def _one(
        self, loop: asyncio.AbstractEventLoop, event: SerializedEvent, own: float, started: list[bool]
    ) -> Outcome | None:
        """One event's outcome by ``own``; None if its emit is not started (no time for it)."""
        if self._emitted(event):
            return DELIVERED  # its emit returned in a round that was cut: never again
        call = self._running.get(id(event))
        if call is None or call[0] is not event:
            now = time.monotonic()
            own = min(own, self._closing_by - _MARGIN)
            expected = self._expected
            # Started only if it is expected to end in time; but if it fits no round at all
            # (an emit slower than send_timeout), the first of each round starts anyway.
            if now >= own or (now + expected > own and (started[0] or expected <= self._widest)):
                return None
            started[0] = True
            future = self._executor.submit(self._emit, event)
            with self._lock:
                self._running[id(event)] = (event, future)
            future.add_done_callback(self._forget_running)
        else:
            future = call[1]  # still running from a round that was cut: wait for it
        waiting = read_when_done(asyncio.wrap_future(future, loop=loop))
        while not waiting.done():
            # A close may begin meanwhile, with an earlier deadline (begin_close): look again
            # now and then, so as to answer before the worker's deadline, not after.
            left = min(own, self._closing_by - _MARGIN) - time.monotonic()
            if left <= 0:
                return Outcome.retry("timeout", f"{self!r}: emit still running at the deadline")
            await asyncio.wait({waiting}, timeout=min(left, _LOOK_AGAIN))
        failure = waiting.exception()
        if failure is not None:
            detail = f"{self!r}.emit raised {safe_failure(failure, self._secrets)}"
            self._log.warning("emit", "%s; the events stay buffered", detail)
            return Outcome.retry("transport_error", detail)
        self._emitted(event)
        return DELIVERED

    def _forget_running(self, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            for key, (_, running) in list(self._running.items()):
                if running is future:
                    del self._running[key]
                    return

    def _emitted(self, event: SerializedEvent) -> bool:
        """Whether ``event``'s emit returned (and forget it: its answer is being given)."""
        with self._lock:
            known = self._returned.pop(id(event), None)
        return known is event

    def _emit(self, event: SerializedEvent) -> None:
        started = time.monotonic()
        self.transport.emit(orjson.loads(event.body))
        took = time.monotonic() - started
        with self._lock:
            # What one emit takes, learned (the larger of the last and a decaying average: a
            # transport that slows down is believed at once).
            self._expected = max(took, 0.8 * self._expected + 0.2 * took)
            if len(self._returned) >= _MAX_REMEMBERED:
                self._returned.pop(next(iter(self._returned)))
            self._returned[id(event)] = event

    def begin_close(self, deadline: float) -> None:
        """The outbox's close began (called from any thread): answer before ``deadline``
        (``time.monotonic()``) what the rounds under way have emitted, not after it."""
        self._closing_by = min(self._closing_by, deadline)

    async def aclose(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        # Emits not started yet never will be (nor wait ahead of the transport's close).
        with self._lock:
            waiting = [future for _, future in self._running.values()]
            self._returned.clear()
        for future in waiting:
            future.cancel()
        close = getattr(self.transport, "close", None)
        try:
            if callable(close):
                loop = asyncio.get_running_loop()
                call = read_when_done(loop.run_in_executor(executor, close, 1.0))
                await asyncio.wait({call}, timeout=_CLOSE_WITHIN)
                failure = call.exception() if call.done() else None
                if failure is not None:
                    detail = safe_failure(failure, self._secrets)
                    self._log.warning("close", "%r.close raised %s", self, detail)
        finally:
            # Its threads end (an emit still running ends its thread when it returns).
            executor.shutdown(wait=False)
