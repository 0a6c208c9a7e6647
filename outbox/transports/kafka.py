"""The Kafka transport: batches of events to a topic through aiokafka's producer.

The producer starts lazily, in the sidecar, on the first batch. Each event is one
record keyed as openlineage-python keys it (``run:{namespace}/{name}`` of the parent's
root job, else the parent job, else the job; ``job:``/``dataset:`` for the other event
kinds), so a run's events share a partition and keep their order.

Outcomes: a record the broker (or the producer's ``message.max.bytes``) refuses as too
large is ``too_large`` and never retried; a broker that is down, lost mid-stream, an
unknown topic or a leader change is RETRY, with the outbox's backoff; an authorization
failure is RETRY too, with an error in the log, since it is a misconfiguration.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import difflib
import json
import logging
import ssl
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from .._config._config import ResolvedTransport, tls_context, warn_once
from .._config._settings import check_number
from .._errors import ConfigError
from .._observability._log import RateLimitedLog, limit_library_logs, never_silent
from .._runtime._slices import checkpoint
from .._runtime._threads import read_when_done
from ._base import DELIVERED, About, Outcome, OutcomeKind, SerializedEvent

__all__ = ["SUPPORTED_KEYS", "KafkaTransport"]

#: librdkafka-style key -> aiokafka producer argument.
SUPPORTED_KEYS: dict[str, str] = {
    "bootstrap.servers": "bootstrap_servers",
    "acks": "acks",
    "compression.type": "compression_type",
    "linger.ms": "linger_ms",
    "batch.size": "max_batch_size",
    "message.max.bytes": "max_request_size",
    "client.id": "client_id",
    "request.timeout.ms": "request_timeout_ms",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",  # librdkafka's own spelling
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_context",
    "ssl.certificate.location": "ssl_context",
    "ssl.key.location": "ssl_context",
    "enable.idempotence": "enable_idempotence",
    "retry.backoff.ms": "retry_backoff_ms",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
    "ssl.key.password": "ssl_context",
    "partitioner": "(the outbox picks the partition)",
}
#: librdkafka's other names for supported keys.
ALIASES = {
    "compression.codec": "compression.type",
    "queue.buffering.max.ms": "linger.ms",
    "request.required.acks": "acks",
    "metadata.broker.list": "bootstrap.servers",
}
#: librdkafka's partitioners (``partitioner``): how a key picks a partition.  The default is
#: librdkafka's, which openlineage-python's producer (confluent-kafka) uses; murmur2 is the
#: Java client's.  ``_random`` variants differ only for records without a key.
PARTITIONERS = (
    "consistent_random",
    "consistent",
    "murmur2_random",
    "murmur2",
    "fnv1a_random",
    "fnv1a",
    "random",
)
_SSL_KEYS = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password")
_INTEGERS = (
    "linger.ms",
    "batch.size",
    "message.max.bytes",
    "request.timeout.ms",
    "retry.backoff.ms",
    "metadata.max.age.ms",
    "connections.max.idle.ms",
)
# Bytes a record adds to its key and value in a batch (varints, attributes, headers count).
_RECORD_OVERHEAD = 32
_AIOKAFKA_LOGGERS = (
    "aiokafka",
    "aiokafka.conn",
    "aiokafka.cluster",
    "aiokafka.producer.sender",
    "aiokafka.producer.producer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.consumer.consumer",
)
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_CODECS = {"none": None, "gzip": "gzip", "snappy": "snappy", "lz4": "lz4", "zstd": "zstd"}


class KafkaTransport:
    """Publishes events to ``topic``.

    Example::

        KafkaTransport("lineage-events", {"bootstrap.servers": "broker:9092", "acks": "all"})

    Args:
        topic: the topic to publish to.
        config: librdkafka-style producer settings (see :data:`SUPPORTED_KEYS`);
            ``bootstrap.servers`` is required, ``acks`` defaults to ``all``.
        message_key: a fixed key for every record, instead of openlineage-python's.
        start_timeout: seconds to wait for the brokers when the producer starts.

    Raises:
        ConfigError: an unknown key or an invalid value, named with what is accepted.
    """

    def __init__(
        self,
        topic: str,
        config: Mapping[str, Any],
        *,
        message_key: str | None = None,
        start_timeout: float = 10.0,
    ) -> None:
        if not isinstance(topic, str) or not topic:
            raise ConfigError(
                f"topic={topic!r}: the Kafka transport needs a topic (OPENLINEAGE__TRANSPORT__TOPIC)"
            )
        if (
            len(topic) > 249
            or topic in (".", "..")
            or not all(c.isascii() and (c.isalnum() or c in "._-") for c in topic)
        ):
            raise ConfigError(
                f"topic={topic!r} is not a Kafka topic name: use at most 249 of the letters a-z, A-Z, "
                "digits, '.', '_' and '-' (OPENLINEAGE__TRANSPORT__TOPIC)"
            )
        self.topic = topic
        self.message_key = message_key.encode() if message_key else None
        self.start_timeout = check_number("start_timeout", start_timeout, minimum=0)
        self._settings = producer_settings(config)
        self.partitioner = partitioner_of(config)
        ignored = without_effect(config)
        if ignored:
            never_silent(
                logging.WARNING,
                "Kafka settings with no effect in lineage-outbox (aiokafka has no equivalent): %s",
                ", ".join(with_suggestion(key) for key in ignored),
            )
        self._servers = self._settings["bootstrap_servers"]
        self._max_request_size = self._settings.get("max_request_size", 1024 * 1024)
        self._partitions_cache: dict[tuple[bytes, int], int] = {}
        self._producer: Any = None
        self._starting: Any = None  # a producer being started (stopped by aclose if cut off)
        # One start at a time: the worker's lanes send at once, and each that found no
        # producer made one of its own; all but the last were never stopped (a connection and
        # a sender task each, "Unclosed AIOKafkaProducer" at exit).  An asyncio.Lock binds
        # to the loop it is first contended in, so it is kept beside that loop and made anew
        # when a transport is used from another loop (a second outbox given the same one).
        self._start_lock: asyncio.Lock | None = None
        self._start_loop: asyncio.AbstractEventLoop | None = None
        self._log = RateLimitedLog(30.0)
        # aiokafka logs an ERROR per reconnection attempt while a broker is down.
        limit_library_logs(*_AIOKAFKA_LOGGERS)

    @classmethod
    def from_config(cls, resolved: ResolvedTransport) -> KafkaTransport:
        """Build from openlineage-python's ``kafka`` transport config: ``topic``, ``config``
        (a mapping, or its JSON), ``messageKey``/``message_key``, and ``flush`` (accepted
        and ignored: the outbox never flushes per event, it ships batches in the sidecar)."""
        config = dict(resolved.config or {})
        allowed = {"type", "topic", "config", "messagekey", "messageKey", "message_key", "flush"}
        for unknown in sorted(set(config) - allowed - {"name", "priority"}):
            # openlineage-python ignores keys it does not know (and drops name and priority).
            close = difflib.get_close_matches(unknown, sorted(allowed - {"type"}), n=1)
            listed = "topic, config, messageKey, flush"
            hint = f"did you mean {close[0]}?" if close else f"the settings are {listed}"
            where = resolved.origin(unknown)
            warn_once(f"{where}: {unknown!r} is not a Kafka transport setting (ignored); {hint}")
        producer_config = config.get("config", {})
        if isinstance(producer_config, str):
            try:
                producer_config = json.loads(producer_config)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{resolved.origin('config')} is not JSON: {exc}") from None
        if not isinstance(producer_config, dict):
            raise ConfigError(
                f"{resolved.origin('config')} must be a JSON object of producer settings, "
                'such as {"bootstrap.servers": "broker:9092", "acks": "all"}'
            )
        if "messagekey" in config:
            # OPENLINEAGE__TRANSPORT__MESSAGEKEY becomes "messagekey", which openlineage-python
            # ignores (its field is messageKey): do the same, and say how to set it.
            warn_once(
                f"{resolved.origin('messagekey')} is ignored, as openlineage-python ignores it: "
                "set OPENLINEAGE__TRANSPORT__MESSAGE_KEY (or messageKey in openlineage.yml)"
            )
        key = config.get("messageKey") or config.get("message_key")
        topic = config.get("topic")
        if isinstance(topic, (int, float)) and not isinstance(topic, bool):
            where = resolved.origin("topic")
            if where.startswith("OPENLINEAGE__") and ":" not in where:  # (a variable of its own)
                quoted = f"{where}='\"{topic}\"'"
            else:  # (in a file, or in a variable's JSON)
                quoted = f'"{topic}"'
            raise ConfigError(  # (a variable's value is read as JSON, as openlineage-python reads it)
                f"{where}={topic!r} is read as a number, not a topic name; quote it ({quoted})"
            )
        if not isinstance(topic, str) or not topic:
            where = resolved.origin("topic") if resolved.member else "OPENLINEAGE__TRANSPORT__TOPIC"
            raise ConfigError(f"the kafka transport needs a topic: set {where}")
        try:
            return cls(topic, producer_config, message_key=str(key) if key else None)
        except ConfigError as exc:
            raise ConfigError(f"{resolved.origin('config')}: {exc}") from None

    def __repr__(self) -> str:
        return f"KafkaTransport({self.topic!r}, bootstrap.servers={self._servers!r})"

    # -- the Transport protocol -------------------------------------------------------------

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        producer = await self._started(deadline)
        if isinstance(producer, Outcome):
            return [producer] * len(batch)
        from aiokafka.errors import KafkaError

        outcomes: list[Outcome | None] = [None] * len(batch)
        try:
            partitions = sorted(
                await asyncio.wait_for(
                    producer.partitions_for(self.topic), max(0.0, deadline - time.monotonic())
                )
            )
        except (KafkaError, TimeoutError) as exc:
            return [self._outcome(exc)] * len(batch)
        # Records go straight into per-partition batches (aiokafka's create_batch/send_batch):
        # several times cheaper than one send() and one future per record.  A group per
        # partition (not the worker's lanes: a lane is one request of the worker's).
        groups: dict[int, list[tuple[int, bytes | None]]] = {}
        for index, event in enumerate(batch):
            if not index & 63:
                checkpoint()
            key = self.message_key or (event.key.encode() if event.key else None)
            if len(event.body) + len(key or b"") + _RECORD_OVERHEAD > self._max_request_size:
                outcomes[index] = Outcome.rejected(
                    "too_large",
                    f"a {len(event.body)}-byte record exceeds message.max.bytes ({self._max_request_size})",
                )
                continue
            if key is None and self.partitioner.endswith("random"):
                partition = partitions[index % len(partitions)]  # spread, as random does
            else:
                partition = partitions[self._partition_of(key or b"", len(partitions))]
            groups.setdefault(partition, []).append((index, key))
        await asyncio.gather(
            *(
                self._send_partition(producer, partition, members, batch, outcomes, deadline)
                for partition, members in groups.items()
            )
        )
        return [o if o is not None else DELIVERED for o in outcomes]

    async def _send_partition(
        self,
        producer: Any,
        partition: int,
        members: list[tuple[int, bytes | None]],
        batch: Sequence[SerializedEvent],
        outcomes: list[Outcome | None],
        deadline: float,
    ) -> None:
        """One partition's records, one producer batch at a time: the next is handed to the
        producer only once the broker has acknowledged the previous one.  A run's records
        share a partition, and a producer that is not idempotent gives up on a batch that
        expired while the broker was away and then sends the next one: handed over together,
        a run's later records were written while its earlier ones came back for a retry.
        When a batch is not acknowledged, the partition's later records are not sent
        (DEFERRED: they follow it when it is retried)."""
        from aiokafka.errors import KafkaError

        position = 0
        while position < len(members):
            builder, indexes = producer.create_batch(), list[int]()
            while position < len(members):
                checkpoint()  # aiokafka encodes each record in Python: a slice at a time
                index, key = members[position]
                if builder.append(key=key, value=batch[index].body, timestamp=None) is None:
                    break  # full: the rest go in the next producer batch
                indexes.append(index)
                position += 1
            if not indexes:  # not even alone (size checked above: should not happen)
                index = members[position][0]
                outcomes[index] = Outcome.rejected("too_large", "the record does not fit a producer batch")
                position += 1
                continue
            outcome: Outcome = DELIVERED
            try:
                future = read_when_done(
                    await asyncio.wait_for(
                        producer.send_batch(builder, self.topic, partition=partition),
                        max(0.0, deadline - time.monotonic()),
                    )
                )
                done, _ = await asyncio.wait({future}, timeout=max(0.0, deadline - time.monotonic()))
                if not done:
                    outcome = Outcome.retry("timeout", f"no acknowledgement from {self._servers} in time")
                elif (failure := future.exception()) is not None:
                    outcome = self._outcome(failure, len(indexes))
            except TimeoutError:
                outcome = Outcome.retry("timeout", f"no room in the producer for {self.topic!r} in time")
            except KafkaError as exc:
                outcome = self._outcome(exc, len(indexes))
            for index in indexes:
                outcomes[index] = outcome
            if outcome.kind is OutcomeKind.RETRY:
                for index, _ in members[position:]:
                    outcomes[index] = Outcome.deferred()
                return

    def _partition_of(self, key: bytes, count: int) -> int:
        """The partition index the configured partitioner picks for a key, as librdkafka
        does (``consistent``: CRC-32; ``fnv1a``: 32-bit FNV-1a; ``murmur2``: the Java
        client's, positive).  Run keys repeat, so cache it."""
        cache = self._partitions_cache
        found = cache.get((key, count))
        if found is None:
            if len(cache) >= 10_000:
                cache.clear()
            found = cache[(key, count)] = partition_for(self.partitioner, key, count)
        return found

    async def aclose(self) -> None:
        # A producer whose start was cut off by a deadline is stopped too: it holds
        # connections, and aiokafka warns about it at exit otherwise.
        for producer in (self._producer, self._starting):
            if producer is not None:
                await producer.stop()
        self._producer = self._starting = None

    def clone(self) -> KafkaTransport:
        """The same configuration, with no producer (for a forked child: the parent's
        producer, its connections and its loop are not the child's to use)."""
        twin = copy.copy(self)
        twin._producer = twin._starting = twin._start_lock = twin._start_loop = None
        twin._partitions_cache = {}
        twin._log = RateLimitedLog(30.0)
        return twin

    # -- internals --------------------------------------------------------------------------

    async def _started(self, deadline: float) -> Any:
        if self._producer is not None:
            return self._producer
        loop = asyncio.get_running_loop()
        if self._start_lock is None or self._start_loop is not loop:
            self._start_lock, self._start_loop = asyncio.Lock(), loop
        lock = self._start_lock
        try:
            # (Lock.acquire gives the lock on to the next waiter if cancelled once woken.)
            await asyncio.wait_for(lock.acquire(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return Outcome.retry("timeout", f"the producer for {self._servers} was still starting")
        try:
            # Another lane's start may have ended while this one waited: its producer, or
            # (it failed) a start of this lane's own.
            return self._producer if self._producer is not None else await self._start(deadline)
        finally:
            lock.release()

    async def _start(self, deadline: float) -> Any:
        from aiokafka import AIOKafkaProducer
        from aiokafka.errors import KafkaError

        producer = AIOKafkaProducer(**self._settings)
        budget = min(self.start_timeout, max(0.0, deadline - time.monotonic()))
        self._starting = producer
        try:
            await asyncio.wait_for(producer.start(), budget)
        except (KafkaError, OSError, TimeoutError) as exc:
            self._starting = None
            # A producer that failed to start cannot be started again: make a new one next time.
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                await asyncio.wait_for(producer.stop(), 1.0)
            detail = f"cannot reach the Kafka brokers {self._servers}: {type(exc).__name__}: {exc}"
            self._log.warning("start", "%s; events stay buffered", detail)
            return Outcome.retry("network", detail)
        self._starting = None
        self._producer = producer
        return producer

    def _outcome(self, exc: BaseException, records: int = 1) -> Outcome:
        from aiokafka import errors

        name = type(exc).__name__
        detail = f"{name} from {self._servers} for topic {self.topic!r}: {exc}"
        if isinstance(
            exc, (errors.MessageSizeTooLargeError, errors.RecordTooLargeError, errors.RecordListTooLargeError)
        ):
            # The broker weighs the whole producer batch against the topic's max.message.bytes:
            # several records are split and sent again (REQUEST); one alone is too large.
            if records > 1:
                return Outcome.retry("too_large", detail, about=About.REQUEST)
            return Outcome.rejected("too_large", detail)
        if isinstance(
            exc, (errors.CorruptRecordException, errors.InvalidMessageError, errors.InvalidTimestampError)
        ):
            # About the records of that producer batch, not the broker: poison suspects, which
            # the worker isolates (and settles as poison if the broker keeps refusing them alone).
            return Outcome.retry(name, detail, about=About.EVENT if records == 1 else About.REQUEST)
        if isinstance(
            exc,
            (
                errors.TopicAuthorizationFailedError,
                errors.ClusterAuthorizationFailedError,
                errors.AuthenticationFailedError,
            ),
        ):
            self._log.error(
                f"auth-{name}", "%s: check the SASL/SSL settings and ACLs; events stay buffered", detail
            )
        return Outcome.retry(name, detail)


def partition_for(partitioner: str, key: bytes, count: int) -> int:
    """Where librdkafka's ``partitioner`` puts a record with ``key`` among ``count`` partitions."""
    if partitioner.startswith("murmur2"):
        from aiokafka.partitioner import murmur2

        return (int(murmur2(key)) & 0x7FFFFFFF) % count
    if partitioner.startswith("fnv1a"):
        digest = 0x811C9DC5
        for byte in key:
            digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
        signed = digest - (1 << 32) if digest & 0x80000000 else digest
        return abs(signed) % count  # librdkafka: abs() of the hash as a signed 32-bit integer
    return zlib.crc32(key) % count  # consistent, consistent_random (and random, keyed)


def without_effect(config: Mapping[str, Any]) -> list[str]:
    """The librdkafka keys of ``config`` that aiokafka has no equivalent for (accepted, and
    logged once by the transport: openlineage-python hands every key to librdkafka)."""
    return sorted(key for key in config if key not in SUPPORTED_KEYS and key not in ALIASES)


def with_suggestion(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, [*SUPPORTED_KEYS, *ALIASES], n=1, cutoff=0.8)
    return f"{key} (did you mean {close[0]}?)" if close else key


def partitioner_of(config: Mapping[str, Any]) -> str:
    name = str(config.get("partitioner", "consistent_random")).strip().lower()
    if name not in PARTITIONERS:
        raise ConfigError(f"partitioner={config.get('partitioner')!r}: use one of {', '.join(PARTITIONERS)}")
    return name


def producer_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """aiokafka producer arguments from librdkafka-style keys, validated.  librdkafka's
    aliases are read as the keys they stand for; keys with no aiokafka equivalent are left
    out (see :func:`without_effect`); a value that cannot work is a ConfigError naming it."""
    config = dict(config)
    for alias, key in ALIASES.items():
        if alias in config:
            config.setdefault(key, config.pop(alias))
    servers = config.get("bootstrap.servers")
    if not isinstance(servers, str) or not servers.strip():
        raise ConfigError('bootstrap.servers is required, e.g. {"bootstrap.servers": "broker:9092"}')
    settings: dict[str, Any] = {"bootstrap_servers": _servers(servers)}
    acks = str(config.get("acks", "all")).strip().lower()
    acks_map: dict[str, Any] = {"all": "all", "-1": "all", "0": 0, "1": 1}
    if acks not in acks_map:
        raise ConfigError(f"acks={config.get('acks')!r} is not valid; use all, 1 or 0")
    settings["acks"] = acks_map[acks]
    # Batches of up to 256 KiB per partition unless batch.size says otherwise (aiokafka's own
    # default, 16 KiB, makes one request per dozen events).
    settings["max_batch_size"] = 256 * 1024
    settings.update(_integer_settings(config))
    if "compression.type" in config:
        codec = str(config["compression.type"]).lower()
        if codec not in _CODECS:
            raise ConfigError(
                f"compression.type={config['compression.type']!r}: use one of {', '.join(_CODECS)}"
            )
        _check_codec(codec)
        settings["compression_type"] = _CODECS[codec]
    if "client.id" in config:
        settings["client_id"] = str(config["client.id"])
    settings.update(_security_settings(config))
    if "enable.idempotence" in config:
        value = config["enable.idempotence"]
        if isinstance(value, str):
            value = {"true": True, "false": False}.get(value.strip().lower(), value)
        if not isinstance(value, bool):
            raise ConfigError(f"enable.idempotence={config['enable.idempotence']!r}: use true or false")
        if value and settings["acks"] != "all":
            raise ConfigError("enable.idempotence=true needs acks=all")
        settings["enable_idempotence"] = value
    return settings


def _servers(text: str) -> list[str]:
    """``bootstrap.servers``' entries, each ``host``, ``host:port`` or ``[IPv6]:port`` as
    aiokafka reads them; one it could only fail to reach at every send (a scheme, a placeholder
    such as ``<broker>``, a port that is not one) is a ConfigError here."""
    from aiokafka.conn import get_ip_port_afi

    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    for entry in entries:
        fix = 'use host:port, e.g. {"bootstrap.servers": "broker:9092"}'
        if "://" in entry:
            raise ConfigError(
                f"bootstrap.servers: {entry!r} has a scheme; {fix} (security.protocol sets TLS)"
            )
        try:
            host, port, _ = get_ip_port_afi(entry)
        except ValueError:
            raise ConfigError(
                f"bootstrap.servers: {entry!r} has a port that is not a number; {fix}"
            ) from None
        if not 0 < port <= 65535:
            raise ConfigError(f"bootstrap.servers: {entry!r} has a port out of range (1-65535); {fix}")
        if not host or not (":" in host or all(c.isalnum() or c in "-._" for c in host)):
            raise ConfigError(f"bootstrap.servers: {entry!r} has no host name there; {fix}")
    return entries


def _integer_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The whole-number settings (linger.ms, batch.size, ...) as aiokafka's arguments."""
    settings: dict[str, Any] = {}
    for key in _INTEGERS:
        if key in config:
            value = config[key]
            try:
                number = int(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{key}={value!r} is not a whole number") from None
            if number < 0 or (number == 0 and key != "linger.ms"):
                raise ConfigError(f"{key}={value!r} is out of range")
            settings[SUPPORTED_KEYS[key]] = number
    return settings


def _security_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """security.protocol, SASL and TLS as aiokafka's arguments."""
    settings: dict[str, Any] = {}
    protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
    if protocol not in _PROTOCOLS:
        raise ConfigError(
            f"security.protocol={config.get('security.protocol')!r}: use one of {', '.join(_PROTOCOLS)}"
        )
    settings["security_protocol"] = protocol
    mechanism = config.get("sasl.mechanism", config.get("sasl.mechanisms"))
    if mechanism is not None:
        mechanism = str(mechanism).upper()
        if mechanism not in _MECHANISMS:
            raise ConfigError(
                f"sasl.mechanism={mechanism!r} is not supported; use one of {', '.join(_MECHANISMS)}"
            )
        settings["sasl_mechanism"] = mechanism
    if "sasl.username" in config:
        settings["sasl_plain_username"] = str(config["sasl.username"])
    if "sasl.password" in config:
        settings["sasl_plain_password"] = str(config["sasl.password"])
    if protocol.startswith("SASL") and not (
        settings.get("sasl_plain_username") and settings.get("sasl_plain_password")
    ):
        raise ConfigError(f"security.protocol={protocol} needs sasl.username and sasl.password")
    if protocol in ("SSL", "SASL_SSL") or any(k in config for k in _SSL_KEYS):
        settings["ssl_context"] = _ssl_context(config)
    return settings


def _ssl_context(config: Mapping[str, Any]) -> ssl.SSLContext:
    ca = config.get("ssl.ca.location")
    cert = config.get("ssl.certificate.location")
    key = config.get("ssl.key.location")
    if key and not cert:
        raise ConfigError("ssl.key.location needs ssl.certificate.location")
    password = config.get("ssl.key.password")
    return tls_context(
        ca,
        cert,
        key,
        password=None if password is None else str(password),
        described=f"ssl.ca.location={ca!r}, ssl.certificate.location={cert!r}",
    )


def _check_codec(codec: str) -> None:
    modules = {"snappy": "snappy", "lz4": "lz4", "zstd": "zstandard"}
    module = modules.get(codec)
    if module is None:
        return
    try:
        __import__(module)
    except ImportError:
        raise ConfigError(
            f"compression.type={codec} needs the {module!r} package (pip install aiokafka[{codec}]); "
            "gzip works without one"
        ) from None
