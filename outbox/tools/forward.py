"""``outbox forward``: consume OpenLineage events from a Kafka topic and post them to an
HTTP backend (Marquez, OpenMetadata, DataHub, ...) through :class:`HttpTransport`.

* A consumer group: start several forwarders with the same ``group_id`` and they share
  the topic's partitions.
* At least once: a partition's offsets are committed only after every event of the
  records consumed has been delivered or rejected by the backend. A forwarder that dies
  mid-way leaves them uncommitted, and whoever owns the partition next sends them again.
* A record that is not an OpenLineage event (not a JSON object with ``eventTime`` and a
  ``run``, ``job`` or ``dataset``) is skipped and counted, or, with a dead-letter topic,
  produced there with an ``outbox-error`` header.
* Retries are paced by the worker's own bounded backoff (:func:`outbox._worker._retry.backoff_delay`,
  full jitter up to ``backoff_cap``; a server's ``Retry-After`` up to ``max_retry_after``), for
  as long as the backend fails: hours, any number of attempts.
* SIGTERM (or ``stop``) drains: the batch in hand is tried until ``drain_timeout``, paced as
  the worker paces its close (one immediate attempt, then waits bounded by a second and by the
  time left, at least 0.1 s apart, the last a quarter of a second before the deadline); a request
  still in flight at the deadline is cut off; what was delivered is committed, the rest is left
  for whoever owns the partition next, and it exits.
* A progress line every ``progress_interval`` seconds, during an outage too: consumed,
  delivered, rejected, skipped, dead-lettered, the lag (from the first record not yet settled
  to the partition's end, committed or not), and while failing, for how long and why.
* Brokers that cannot be reached at start: :class:`BrokersUnreachable` (one sentence naming
  them), or with ``wait_for_brokers`` retries, paced, with a progress line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import orjson

# The worker's backoff and close pacing: one implementation, one set of numbers.
from .._toolkit import NO_TIME_LEFT as _NO_TIME_LEFT
from .._toolkit import (
    RateLimitedLog,
    backoff_delay,
    close_paced,
    limit_library_logs,
    logger,
    producer_settings,
    serialize,
)
from ..transports import Outcome, OutcomeKind, SerializedEvent, Transport

__all__ = ["BrokersUnreachable", "ForwardStats", "Forwarder"]

# aiokafka's loggers: an ERROR per failed connection.  Quiet while connecting (the forwarder
# says it in one line), rate-limited after.
_AIOKAFKA_LOGGERS = (
    "aiokafka",
    "aiokafka.conn",
    "aiokafka.cluster",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
)


class BrokersUnreachable(Exception):
    """The Kafka brokers could not be reached at start (the message names them)."""


class _KafkaTrouble(logging.Filter):
    """Notes aiokafka's errors while forwarding (it retries on its own, silently to the
    forwarder), so that a progress line can say the brokers are away; passes them on."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self.last = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            self.times = [*self.times[-999:], time.monotonic()]
            self.last = record.getMessage()
        return True

    def since(self, start: float) -> tuple[int, str]:
        """How many errors since ``start``, and the last one's text."""
        count = sum(1 for t in self.times if t >= start)
        return count, self.last if count else ""


async def _stop_client(client: Any, timeout: float = 5.0) -> None:
    """Stop an aiokafka consumer or producer whose brokers may be gone: bounded, and without
    the errors of its own cancelled fetch tasks (aiokafka's close awaits them and lets their
    CancelledError out) unless this task itself is being cancelled."""
    from aiokafka.errors import KafkaError

    try:
        await asyncio.wait_for(client.stop(), timeout)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
    except (KafkaError, OSError, TimeoutError):
        pass


class _Quiet(logging.Filter):
    """Holds aiokafka's records back while connecting, keeping the last error's text."""

    last_error = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            self.last_error = record.getMessage()
        return False


# Producer settings that a consumer takes too.
_CONSUMER_KEYS = {
    "bootstrap_servers",
    "client_id",
    "request_timeout_ms",
    "security_protocol",
    "ssl_context",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
}


@dataclass
class ForwardStats:
    """What a forwarder did (``Forwarder.stats``)."""

    consumed: int = 0
    delivered: int = 0
    rejected: int = 0
    skipped: int = 0
    dead_lettered: int = 0
    commits: int = 0
    lag: int = 0


class _Offsets:
    """The forwarder's at-least-once bookkeeping, per partition: the first offset fetched and
    not yet settled (what the lag counts from), and the commit once a batch is settled."""

    def __init__(self, log: RateLimitedLog) -> None:
        self._log = log
        #: Per partition: the first offset fetched and not yet settled.
        self.held: dict[Any, int] = {}

    def fetched(self, batches: Mapping[Any, Sequence[Any]], assigned: Collection[Any]) -> None:
        """A poll returned ``batches`` (records by partition) with ``assigned`` partitions."""
        for partition in [p for p in self.held if p not in assigned]:
            del self.held[partition]  # revoked: another forwarder's now
        for partition, records in batches.items():
            self.held.setdefault(partition, records[0].offset)

    async def settled(self, consumer: Any, partition: Any, offset: int) -> bool:
        """Every record of ``partition`` before ``offset`` is settled: commit it.  False if the
        commit failed (logged): then whoever owns the partition next sends them again."""
        from aiokafka.errors import KafkaError

        try:
            await consumer.commit({partition: offset})
            committed = True
        except KafkaError as exc:
            # The partition moved to another forwarder, or the broker is away: these records
            # are sent again by whoever owns the partition next (at least once).
            self._log.warning("commit", "could not commit %s at %d: %s", partition, offset, exc)
            committed = False
        self.held.pop(partition, None)
        return committed

    async def lag(self, consumer: Any) -> tuple[int, int]:
        """(records from the first one not yet settled to the partition's end, summed over the
        assigned partitions whose end is known; partitions whose end is not known yet).  No
        broker round trip: the end is what the last fetch said."""
        from aiokafka.errors import KafkaError

        lag = unknown = 0
        for partition in consumer.assignment():
            highwater = consumer.highwater(partition)
            if highwater is None:
                unknown += 1
                continue
            first = self.held.get(partition)
            if first is None:
                try:  # known (no round trip) once the partition has been fetched
                    first = await asyncio.wait_for(consumer.position(partition), 1.0)
                except (KafkaError, TimeoutError):
                    unknown += 1
                    continue
            lag += max(0, highwater - first)
        return lag, unknown


class Forwarder:
    """Forwards ``topic`` to ``transport``.

    Args:
        kafka_config: librdkafka-style settings (``bootstrap.servers`` required; the
            security keys apply, producer-only keys are ignored).
        topic: the topic to read.
        transport: where to post (usually an :class:`HttpTransport`).
        group_id: the consumer group (default ``outbox-forward``).
        dead_letter_topic: where records that are not events go (default: skipped).
        max_records: records per poll, and so the largest batch posted.
        progress_interval: seconds between progress lines (0: none).
        drain_timeout: seconds to finish the batch in hand when stopping.
        backoff_base, backoff_cap: retry pacing for a backend that fails (full jitter).
        max_retry_after: the longest ``Retry-After`` honoured, in seconds.
        session_timeout: the consumer group session, in seconds: a forwarder that dies
            gives its partitions up after this long (Kafka brokers require >= 6 by default).
        wait_for_brokers: brokers unreachable at start: retry (paced, with progress lines)
            instead of raising :class:`BrokersUnreachable`.
        print_line: where progress lines go (default: the ``outbox`` logger at INFO).
    """

    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        topic: str,
        transport: Transport,
        *,
        group_id: str = "outbox-forward",
        dead_letter_topic: str | None = None,
        max_records: int = 1000,
        progress_interval: float = 10.0,
        drain_timeout: float = 10.0,
        backoff_base: float = 0.2,
        backoff_cap: float = 30.0,
        max_retry_after: float = 300.0,
        session_timeout: float = 10.0,
        wait_for_brokers: bool = False,
        print_line: Callable[[str], None] | None = None,
    ) -> None:
        settings = producer_settings(kafka_config)
        self._consumer_settings = {k: v for k, v in settings.items() if k in _CONSUMER_KEYS}
        self._producer_settings = settings
        self.brokers = str(kafka_config.get("bootstrap.servers", "?"))
        self.topic = topic
        self.transport = transport
        self.group_id = group_id
        self.dead_letter_topic = dead_letter_topic
        self.max_records = max_records
        self.progress_interval = progress_interval
        self.drain_timeout = drain_timeout
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.max_retry_after = max_retry_after
        self.session_timeout = session_timeout
        self.wait_for_brokers = wait_for_brokers
        self._print = print_line or (lambda line: logger.info("%s", line))
        self._log = RateLimitedLog(30.0)
        self.stats = ForwardStats()
        self._offsets = _Offsets(self._log)
        self._consumer: Any = None
        self._stopping = asyncio.Event()
        self._drain_deadline = float("inf")
        self._last_progress = time.monotonic()
        #: While the backend fails: since when, how many attempts, and why.
        self._failing_since: float | None = None
        self._attempts = 0
        self._last_error = ""
        #: aiokafka's errors while forwarding (the brokers away, a coordinator lost).
        self._trouble = _KafkaTrouble()
        self._previous_progress = time.monotonic()

    def stop(self) -> None:
        """Finish the batch in hand, commit, and return from :meth:`run` (call in its loop)."""
        if not self._stopping.is_set():
            self._drain_deadline = time.monotonic() + self.drain_timeout
            self._stopping.set()

    async def run(self) -> ForwardStats:
        """Forward until :meth:`stop`.

        Raises:
            BrokersUnreachable: the brokers cannot be reached at start (unless ``wait_for_brokers``).
        """
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        def consumer() -> Any:
            return AIOKafkaConsumer(
                self.topic,
                group_id=self.group_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=int(self.session_timeout * 1000),
                # How long a rebalance waits for members to rejoin; a dead one never does.
                rebalance_timeout_ms=int(self.session_timeout * 1000),
                heartbeat_interval_ms=max(100, int(self.session_timeout * 1000 / 4)),
                **self._consumer_settings,
            )

        def producer() -> Any:
            return AIOKafkaProducer(**self._producer_settings)

        try:
            self._consumer = await self._start(consumer)
            dead_letters = None
            if self._consumer is not None and self.dead_letter_topic:
                dead_letters = await self._start(producer)
                if dead_letters is None:
                    await self._consumer.stop()
                    self._consumer = None
        except BaseException:
            await self.transport.aclose()
            raise
        if self._consumer is None:  # stopped while waiting for the brokers
            await self.transport.aclose()
            return self.stats
        limit_library_logs(*_AIOKAFKA_LOGGERS)
        for name in _AIOKAFKA_LOGGERS:  # first: the rate limit must not hide one from it
            logging.getLogger(name).filters.insert(0, self._trouble)
        try:
            await self._loop(self._consumer, dead_letters)
        finally:
            if self.progress_interval:
                with contextlib.suppress(Exception):
                    await self._progress()
            # The brokers may be gone by now: each stop is bounded, and quiet about it.
            await _stop_client(self._consumer)
            if dead_letters is not None:
                await _stop_client(dead_letters)
            await self.transport.aclose()
            for name in _AIOKAFKA_LOGGERS:
                logging.getLogger(name).removeFilter(self._trouble)
        return self.stats

    async def _start(self, make: Callable[[], Any]) -> Any:
        """A started consumer or producer; None if stopped while waiting for the brokers."""
        from aiokafka.errors import KafkaError

        quiet = _Quiet()
        for name in _AIOKAFKA_LOGGERS:
            logging.getLogger(name).addFilter(quiet)
        try:
            attempt = 0
            while True:
                client = make()
                try:
                    await client.start()
                    return client
                except KafkaError as exc:
                    await client.stop()  # else aiokafka warns of an unclosed client
                    error = quiet.last_error or str(exc).removeprefix(f"{type(exc).__name__}: ")
                    quiet.last_error = ""
                    if not self.wait_for_brokers:
                        raise BrokersUnreachable(
                            f"cannot reach the Kafka brokers {self.brokers} ({error}); start them or fix "
                            "--bootstrap-servers (--wait-for-brokers retries until they answer)"
                        ) from None
                    attempt += 1
                    delay = backoff_delay(attempt, self.backoff_base, self.backoff_cap)
                    if attempt == 1 or self._progress_due():
                        self._last_progress = time.monotonic()
                        self._print(
                            f"forward {self.topic}: waiting for the Kafka brokers {self.brokers} "
                            f"(attempt {attempt}, next in {delay:.1f} s): {error}"
                        )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), delay)
                    if self._stopping.is_set():
                        return None
        finally:
            for name in _AIOKAFKA_LOGGERS:
                logging.getLogger(name).removeFilter(quiet)

    async def _loop(self, consumer: Any, dead_letters: Any) -> None:
        while not self._stopping.is_set():
            poll = asyncio.ensure_future(consumer.getmany(timeout_ms=500, max_records=self.max_records))
            stopping = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait({poll, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not poll.done():
                poll.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poll
                break
            batches = poll.result()
            self._offsets.fetched(batches, consumer.assignment())
            for partition, records in batches.items():
                if not await self._forward(records, dead_letters):
                    return  # stopping before this batch was settled: leave it uncommitted
                if await self._offsets.settled(consumer, partition, records[-1].offset + 1):
                    self.stats.commits += 1
            if self._progress_due():
                await self._progress()

    def _progress_due(self) -> bool:
        interval = self.progress_interval
        return bool(interval) and time.monotonic() - self._last_progress >= interval

    async def _forward(self, records: Sequence[Any], dead_letters: Any) -> bool:
        """Deliver or reject every event in ``records``; False if stopping cut it short."""
        events = await self._events(records, dead_letters)
        attempt = 0
        while events:
            now = time.monotonic()
            deadline = min(self._drain_deadline, now + 60.0)
            if now >= self._drain_deadline - _NO_TIME_LEFT:
                return False
            outcomes = await self._send(events, deadline)
            if outcomes is None:
                return False  # cut off by the drain deadline: left uncommitted
            retry, moved = self._settle(events, outcomes)
            if not retry:
                self._failing_since = None
                self._attempts = 0
                return True
            events = [event for event, _ in retry]
            if all(outcome.kind is OutcomeKind.DEFERRED for _, outcome in retry):
                # Handed back unsent by the transport: again at once, after a pause if nothing
                # at all moved (a transport that only defers must not spin the loop).
                if not moved:
                    await self._wait(self._paced(min(self.backoff_base, 0.05)))
                continue
            if moved:
                attempt = 0
            attempt += 1
            if not await self._wait(self._failed(retry, attempt)):
                # Stopping began during the wait: one attempt at once (as the worker's close).
                continue
            if self._stopping.is_set() and time.monotonic() >= self._drain_deadline - _NO_TIME_LEFT:
                return False
        return True

    async def _send(self, events: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome] | None:
        """The transport's answer, or None when stopping and the drain deadline came first: a
        request in flight at SIGTERM (a backend that does not answer) is cut off there, as the
        worker's close cuts its sends, not left to run out its own timeout."""
        send = asyncio.ensure_future(self.transport.send(events, deadline))
        if not self._stopping.is_set():
            stopping = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait({send, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if send.done():
                return send.result()
        try:
            return await asyncio.wait_for(send, max(0.0, self._drain_deadline - time.monotonic()))
        except TimeoutError:
            return None

    async def _events(self, records: Sequence[Any], dead_letters: Any) -> list[SerializedEvent]:
        """The events among ``records``; the other records dead-lettered, or skipped with a
        warning."""
        events: list[SerializedEvent] = []
        for record in records:
            self.stats.consumed += 1
            reason = None
            try:
                event = serialize(record.value or b"")
                plain = orjson.loads(event.body)
                if "eventTime" not in plain or not ({"run", "job", "dataset"} & plain.keys()):
                    reason = "not an OpenLineage event (no eventTime, or no run, job or dataset)"
            except ValueError as exc:
                reason = str(exc)
            if reason is None:
                events.append(event)
            elif dead_letters is not None:
                await dead_letters.send_and_wait(
                    self.dead_letter_topic,
                    record.value,
                    key=record.key,
                    headers=[("outbox-error", reason.encode())],
                )
                self.stats.dead_lettered += 1
            else:
                self.stats.skipped += 1
                self._log.warning(
                    "skip",
                    "skipping record %s-%d@%d: %s",
                    self.topic,
                    record.partition,
                    record.offset,
                    reason,
                )
        return events

    def _settle(
        self, events: Sequence[SerializedEvent], outcomes: Sequence[Outcome]
    ) -> tuple[list[tuple[SerializedEvent, Outcome]], bool]:
        """Count the delivered and rejected events; the others with their outcomes, and
        whether any event moved on."""
        retry = []
        moved = False
        for event, outcome in zip(events, outcomes, strict=True):
            if outcome.kind is OutcomeKind.DELIVERED:
                self.stats.delivered += 1
                moved = True
            elif outcome.kind is OutcomeKind.REJECTED:
                self.stats.rejected += 1
                moved = True
                self._log.warning(
                    "rejected", "the backend rejected an event: %s", outcome.detail or outcome.reason
                )
            else:
                retry.append((event, outcome))
        return retry, moved

    def _failed(self, retry: Sequence[tuple[SerializedEvent, Outcome]], attempt: int) -> float:
        """Note a failed attempt (for the progress line) and say so; the seconds to wait."""
        self._attempts += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._last_error = retry[0][1].detail or retry[0][1].reason
        retry_after = max((o.retry_after or 0.0) for _, o in retry) or None
        if retry_after is not None:
            retry_after = min(retry_after, self.max_retry_after)
        delay = self._paced(backoff_delay(attempt, self.backoff_base, self.backoff_cap, retry_after))
        self._log.warning(
            "retry",
            "could not deliver %d event(s), retrying in %.2f s: %s",
            len(retry),
            delay,
            self._last_error,
        )
        return delay

    def _paced(self, delay: float) -> float:
        """While stopping, the worker's close pacing: bounded by a second and by the time
        left, the last attempt a little before the deadline, attempts at least 0.1 s apart."""
        if not self._stopping.is_set():
            return delay
        return close_paced(delay, time.monotonic(), self._drain_deadline)

    async def _wait(self, delay: float) -> bool:
        """Wait ``delay`` seconds, printing progress lines when due.  False if stopping began
        meanwhile (the wait is cut short)."""
        was_stopping = self._stopping.is_set()
        end = time.monotonic() + delay
        while True:
            if self._progress_due():
                await self._progress()
            left = end - time.monotonic()
            if left <= 0:
                return True
            step = min(left, self.progress_interval) if self.progress_interval else left
            if was_stopping:
                await asyncio.sleep(step)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), step)
            if self._stopping.is_set():
                return False

    async def _progress(self) -> None:
        self._previous_progress, self._last_progress = self._last_progress, time.monotonic()
        if self._consumer is None:
            return
        lag, unknown = await self._offsets.lag(self._consumer)
        self.stats.lag = lag
        line = ", ".join(f"{k} {v}" for k, v in asdict(self.stats).items() if k != "commits")
        if unknown:
            line += f" (+ {unknown} partition(s) not fetched yet)"
        if self._failing_since is not None:
            line += (
                f"; the backend failing for {time.monotonic() - self._failing_since:.0f} s, "
                f"{self._attempts} attempt(s): {self._last_error}"
            )
        errors, last = self._trouble.since(self._previous_progress)
        if errors:
            # aiokafka retries on its own: without this, the line would read as all quiet.
            line += (
                f"; the Kafka brokers {self.brokers}: {errors} error(s) since the last line, the last: {last}"
            )
        self._print(f"forward {self.topic} -> {self.transport!r}: {line}")
