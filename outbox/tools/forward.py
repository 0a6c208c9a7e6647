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
* SIGTERM (or ``stop``) drains: the batch in hand is finished (within ``drain_timeout``),
  offsets are committed, and it exits.
* A progress line every ``progress_interval`` seconds: consumed, delivered, rejected,
  skipped, lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from .._log import logger
from .._serde import SerializedEvent, serialize
from ..transports._base import OutcomeKind, Transport
from ..transports.kafka import producer_settings

__all__ = ["ForwardStats", "Forwarder"]

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
        session_timeout: the consumer group session, in seconds: a forwarder that dies
            gives its partitions up after this long (Kafka brokers require >= 6 by default).
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
        session_timeout: float = 10.0,
        print_line: Callable[[str], None] | None = None,
    ) -> None:
        settings = producer_settings(kafka_config)
        self._consumer_settings = {k: v for k, v in settings.items() if k in _CONSUMER_KEYS}
        self._producer_settings = settings
        self.topic = topic
        self.transport = transport
        self.group_id = group_id
        self.dead_letter_topic = dead_letter_topic
        self.max_records = max_records
        self.progress_interval = progress_interval
        self.drain_timeout = drain_timeout
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.session_timeout = session_timeout
        self._print = print_line or (lambda line: logger.info("%s", line))
        self.stats = ForwardStats()
        self._positions: dict[Any, int] = {}
        self._stopping = asyncio.Event()
        self._drain_deadline = float("inf")

    def stop(self) -> None:
        """Finish the batch in hand, commit, and return from :meth:`run` (call in its loop)."""
        if not self._stopping.is_set():
            self._drain_deadline = time.monotonic() + self.drain_timeout
            self._stopping.set()

    async def run(self) -> ForwardStats:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        consumer = AIOKafkaConsumer(
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
        dead_letters = AIOKafkaProducer(**self._producer_settings) if self.dead_letter_topic else None
        await consumer.start()
        if dead_letters is not None:
            await dead_letters.start()
        last_progress = time.monotonic()
        try:
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
                for partition, records in poll.result().items():
                    if not await self._forward(records, dead_letters):
                        break  # stopping before this batch was settled: leave it uncommitted
                    await self._commit(consumer, partition, records[-1].offset + 1)
                    self._positions[partition] = records[-1].offset + 1
                if self.progress_interval and time.monotonic() - last_progress >= self.progress_interval:
                    await self._progress(consumer)
                    last_progress = time.monotonic()
        finally:
            if self.progress_interval:
                with contextlib.suppress(Exception):
                    await self._progress(consumer)
            await consumer.stop()
            if dead_letters is not None:
                await dead_letters.stop()
            await self.transport.aclose()
        return self.stats

    async def _forward(self, records: Sequence[Any], dead_letters: Any) -> bool:
        """Deliver or reject every event in ``records``; False if stopping cut it short."""
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
                logger.warning(
                    "skipping record %s-%d@%d: %s", self.topic, record.partition, record.offset, reason
                )
        attempt = 0
        while events:
            deadline = min(self._drain_deadline, time.monotonic() + 60.0)
            if time.monotonic() >= deadline:
                return False
            outcomes = await self.transport.send(events, deadline)
            retry = []
            for event, outcome in zip(events, outcomes, strict=True):
                if outcome.kind is OutcomeKind.DELIVERED:
                    self.stats.delivered += 1
                elif outcome.kind is OutcomeKind.REJECTED:
                    self.stats.rejected += 1
                    logger.warning("the backend rejected an event: %s", outcome.detail or outcome.reason)
                else:
                    retry.append((event, outcome))
            if not retry:
                return True
            events = [event for event, _ in retry]
            if all(outcome.kind is OutcomeKind.DEFERRED for _, outcome in retry):
                continue  # handed back unsent by the transport: again at once
            attempt += 1
            retry_after = max((o.retry_after or 0.0) for _, o in retry)
            delay = retry_after or random.uniform(
                0, min(self.backoff_cap, self.backoff_base * 2 ** (attempt - 1))
            )
            logger.warning(
                "could not deliver %d event(s), retrying in %.2f s: %s", len(retry), delay, retry[0][1].detail
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            if self._stopping.is_set() and time.monotonic() >= self._drain_deadline:
                return False
        return True

    async def _commit(self, consumer: Any, partition: Any, offset: int) -> None:
        from aiokafka.errors import CommitFailedError, IllegalStateError

        try:
            await consumer.commit({partition: offset})
            self.stats.commits += 1
        except (CommitFailedError, IllegalStateError) as exc:
            # The partition moved to another forwarder: it will send these again (at least once).
            logger.warning("could not commit %s at %d: %s", partition, offset, exc)

    async def _progress(self, consumer: Any) -> None:
        # Lag from what the last fetch said (highwater) and where we are; no broker round trip,
        # which would hold up the poll loop (and, measured, a group join by seconds).
        lag = 0
        for partition in consumer.assignment():
            highwater = consumer.highwater(partition)
            position = self._positions.get(partition)
            if highwater is not None and position is not None:
                lag += max(0, highwater - position)
        self.stats.lag = lag
        line = ", ".join(f"{k} {v}" for k, v in asdict(self.stats).items() if k != "commits")
        self._print(f"forward {self.topic} -> {self.transport!r}: {line}")
