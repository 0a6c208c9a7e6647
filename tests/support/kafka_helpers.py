"""Reading a topic back with a real consumer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic


async def _create(bootstrap: str, topic: str, partitions: int, configs: dict[str, str] | None) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        new = NewTopic(topic, num_partitions=partitions, replication_factor=1, topic_configs=configs or {})
        await admin.create_topics([new])
    finally:
        await admin.close()


def create_topic(
    bootstrap: str, topic: str, partitions: int = 3, configs: dict[str, str] | None = None
) -> None:
    """A topic with ``partitions`` and, on a broker that honours them, topic ``configs``."""
    asyncio.run(_create(bootstrap, topic, partitions, configs))


async def _read(
    bootstrap: str,
    topic: str,
    count: int,
    timeout: float,
    until: Callable[[list[dict[str, Any]]], bool] | None,
) -> list[dict[str, Any]]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while (len(records) < count if until is None else not until(records)) and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            for tp, messages in batches.items():
                for m in messages:
                    records.append(
                        {
                            "partition": tp.partition,
                            "offset": m.offset,
                            "key": m.key.decode() if m.key else None,
                            "event": orjson.loads(m.value),
                        }
                    )
    finally:
        await consumer.stop()
    return records


def read_topic(
    bootstrap: str,
    topic: str,
    count: int,
    timeout: float = 20.0,
    until: Callable[[list[dict[str, Any]]], bool] | None = None,
) -> list[dict[str, Any]]:
    """At least ``count`` records, or until ``until(records)`` holds (duplicates count in
    ``count``: pass ``until`` to wait for distinct ones), or what arrived by ``timeout``."""
    return asyncio.run(_read(bootstrap, topic, count, timeout, until))


async def _produce(bootstrap: str, topic: str, values: list[bytes], keys: list[bytes | None] | None) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i, value in enumerate(values):
            await producer.send(topic, value, key=keys[i] if keys else None)
        await producer.flush()
    finally:
        await producer.stop()


def produce(bootstrap: str, topic: str, values: list[bytes], keys: list[bytes | None] | None = None) -> None:
    asyncio.run(_produce(bootstrap, topic, values, keys))


async def _committed(bootstrap: str, topic: str, group: str) -> int:
    from aiokafka import AIOKafkaProducer, TopicPartition

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)  # partitions_for waits on metadata
    await producer.start()
    try:
        partitions = await producer.partitions_for(topic)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        total = 0
        for p in partitions:
            total += await consumer.committed(TopicPartition(topic, p)) or 0
        return total
    finally:
        await consumer.stop()


def committed_offsets(bootstrap: str, topic: str, group: str) -> int:
    """The sum of the group's committed offsets over the topic's partitions."""
    return asyncio.run(_committed(bootstrap, topic, group))


class Acknowledged:
    """A real transport (a KafkaTransport), noting for each event the outbox hands it how
    often it was handed over, and whether and when the transport answered it delivered: what
    the outbox counts as delivered, event by event.  Events are named by (run id, ``n``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        #: (run id, n) -> time.monotonic() of the acknowledgement (the first, if ever twice).
        self.acked: dict[tuple[str, int], float] = {}
        #: (run id, n) -> how many sends it was handed to.
        self.handed: dict[tuple[str, int], int] = {}

    async def send(self, batch: Any, deadline: float) -> Any:
        from outbox.transports import OutcomeKind

        names = []
        for event in batch:
            plain = orjson.loads(event.body)
            name = (plain["run"]["runId"], plain["n"])
            self.handed[name] = self.handed.get(name, 0) + 1
            names.append(name)
        outcomes = await self.inner.send(batch, deadline)
        now = time.monotonic()
        for name, outcome in zip(names, outcomes, strict=True):
            if outcome.kind is OutcomeKind.DELIVERED:
                self.acked.setdefault(name, now)
        return outcomes

    async def aclose(self) -> None:
        await self.inner.aclose()

    def acked_before(self, moment: float) -> set[tuple[str, int]]:
        return {name for name, at in self.acked.items() if at < moment}

    @property
    def handed_again(self) -> int:
        """Hand-overs beyond each event's first: the most copies the outbox itself could have
        caused (a send that timed out or was cancelled after the broker had written it)."""
        return sum(count - 1 for count in self.handed.values())
