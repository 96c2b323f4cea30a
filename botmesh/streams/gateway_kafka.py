"""The webhook gateway's Kafka side (``botmesh gateway``, ``botmesh/_gateway.py``): the
idempotent producer of ``<prefix>.inbound`` (acks=all), and ``<prefix>.gateway.seen``, the
compacted topic of the ``(channel, event id)`` pairs produced, read to its end at start and
tailed after (no consumer group), so a webhook the channel retries is produced once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message

from botmesh.streams.clients import AsyncProducer, read_to_end, reader, watermarks
from botmesh.streams.connection import Brokers
from botmesh.streams.provision import ensure_topics, existing_topics
from botmesh.topics.catalog import Catalog

__all__ = ["GatewayKafka", "KafkaUnavailable"]

log = logging.getLogger("botmesh.gateway")


class KafkaUnavailable(Exception):
    """Kafka cannot take the records now: the webhook is answered 503."""


def _seen_key(channel: str, event_id: str) -> bytes:
    return f"{channel}:{event_id}".encode()


class GatewayKafka:
    """The gateway's Kafka side: the idempotent producer, the seen topic and its tail."""

    def __init__(
        self,
        bootstrap: Brokers,
        prefix: str,
        *,
        request_timeout: float,
        replication: int,
        on_seen: Callable[[str, str, float], None],
    ) -> None:
        self.bootstrap = bootstrap
        self.request_timeout = request_timeout
        self.replication = replication
        self.catalog = Catalog(prefix)
        self._on_seen = on_seen
        self.producer: AsyncProducer | None = None
        self._consumer: Consumer | None = None
        self._tail: threading.Thread | None = None
        self._stopping = threading.Event()
        self.inbound_exists = False

    async def connect(self) -> None:
        """Start the producer, create the seen topic, read it to its end, start the tail.
        Raises on any failure (having closed what it opened)."""
        try:
            # the first contact through the admin client: a refused login or an unknown CA
            # is named (``KafkaAuthError``) rather than a bare connection error
            topics = await asyncio.to_thread(self._provision)
            # idempotent, acks=all, keys partitioned by murmur2 as Java's
            # producers do (``producer_options``): a chat's records stay on one partition
            self.producer = AsyncProducer(
                self.bootstrap,
                settings={
                    "request.timeout.ms": int(max(self.request_timeout, 5.0) * 1000),
                    "client.id": "botmesh-gateway",
                },
            )
            self.inbound_exists = self.catalog.inbound in topics
            await self._known(self.catalog.gateway_seen)
            self._consumer = reader(
                self.bootstrap, "botmesh-gateway-seen", {"client.id": "botmesh-gateway-seen"}
            )
            loaded = await asyncio.to_thread(
                self._load, self._consumer, topics.get(self.catalog.gateway_seen, 1)
            )
        except BaseException:
            await self.close()
            raise
        for key, value, timestamp_ms in loaded:
            self._record(key, value, timestamp_ms)
        log.info(
            "gateway: %d produced events loaded from %s", len(loaded), self.catalog.gateway_seen
        )
        self._stopping.clear()
        self._tail = threading.Thread(
            target=self._follow,
            args=(self._consumer, asyncio.get_running_loop()),
            name="gateway-seen-tail",
            daemon=True,
        )
        self._tail.start()

    async def _known(self, topic: str, within: float = 15.0) -> None:
        """Wait until the broker's metadata has ``topic`` with its leaders (a topic just
        created takes a moment to show)."""
        assert self.producer is not None
        async with asyncio.timeout(within):
            while True:
                metadata = await self.producer.metadata(within)
                t = metadata.topics.get(topic)
                if (
                    t is not None
                    and t.error is None
                    and t.partitions
                    and all(p.leader not in (None, -1) for p in t.partitions.values())
                ):
                    return
                await asyncio.sleep(0.1)

    def _provision(self) -> dict[str, int]:
        specs = self.catalog.gateway_specs(self.replication)
        ensure_topics(self.bootstrap, specs, timeout=10.0)
        return existing_topics(self.bootstrap, timeout=10.0)

    def _load(self, consumer: Consumer, partitions: int) -> list[tuple[bytes, bytes, int]]:
        """The seen topic from its start to its end (blocking); the consumer stays on it."""
        tps = [(self.catalog.gateway_seen, p) for p in range(partitions)]
        spans = watermarks(consumer, tps, timeout=10.0)
        found: list[tuple[bytes, bytes, int]] = []
        read_to_end(consumer, spans, lambda m: found.extend(_fields(m)))
        return found

    def _record(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> int:
        if not key or value is None:
            return 0
        channel, sep, event_id = key.decode("utf-8", "replace").partition(":")
        if not sep:
            return 0
        self._on_seen(channel, event_id, timestamp_ms / 1000.0)
        return 1

    def _records(self, records: list[tuple[bytes, bytes, int]]) -> None:
        for key, value, timestamp_ms in records:
            self._record(key, value, timestamp_ms)

    def _follow(self, consumer: Consumer, loop: asyncio.AbstractEventLoop) -> None:
        """The tail of the seen topic (its own thread): each batch handed to the loop."""
        failing = False
        while not self._stopping.is_set():
            try:
                messages = consumer.consume(num_messages=500, timeout=0.5)
            except Exception as exc:  # librdkafka reconnects on its own
                if not failing:
                    log.warning("gateway: reading %s failed: %s", self.catalog.gateway_seen, exc)
                failing = True
                self._stopping.wait(1.0)
                continue
            found: list[tuple[bytes, bytes, int]] = []
            for m in messages:
                err = m.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    if not failing:
                        log.warning(
                            "gateway: reading %s failed: %s", self.catalog.gateway_seen, err
                        )
                    failing = True
                    continue
                found.extend(_fields(m))
            if found:
                failing = False
                with contextlib.suppress(RuntimeError):  # the loop closed: the gateway stops
                    loop.call_soon_threadsafe(self._records, found)

    async def send(self, topic: str, key: bytes, value: bytes) -> Awaitable[Any]:
        """Enqueue one record; the result resolves when the broker acked it."""
        return await self.send_with_headers(topic, key, value, None)

    async def send_with_headers(
        self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]] | None
    ) -> Awaitable[Any]:
        """``send`` with the record's headers (a trace's ``traceparent``)."""
        if self.producer is None:
            raise KafkaUnavailable("the producer is not started")
        return await self.producer.send(topic, value, key=key, headers=headers)

    async def write_seen(self, channel: str, event_id: str, where: Any) -> None:
        value = json.dumps(
            {"v": 1, "topic": where.topic, "partition": where.partition, "offset": where.offset}
        ).encode()
        try:
            ack = await self.send(self.catalog.gateway_seen, _seen_key(channel, event_id), value)
            await ack
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "gateway: %s event %r produced but not recorded in %s (%s: %s); a retry of it "
                "would be produced again, and the worker's inbox dedupes it",
                channel,
                event_id,
                self.catalog.gateway_seen,
                type(exc).__name__,
                exc,
            )

    async def topics(self) -> set[str]:
        """The topic names the cluster has now (a metadata request, no auto-creation)."""
        if self.producer is None:
            raise KafkaUnavailable("the producer is not started")
        metadata = await self.producer.metadata(5.0)
        names: set[str] = {name for name, t in metadata.topics.items() if t.error is None}
        self.inbound_exists = self.catalog.inbound in names
        return names

    async def close(self) -> None:
        """Flush and stop (idempotent)."""
        self._stopping.set()
        tail, self._tail = self._tail, None
        if tail is not None:
            await asyncio.to_thread(tail.join)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await asyncio.to_thread(consumer.close)
        producer, self.producer = self.producer, None
        if producer is not None:
            await producer.close(self.request_timeout)


def _fields(m: Message) -> list[tuple[bytes, bytes, int]]:
    """A record's key, value and timestamp (ms); none for an event or a tombstone."""
    key, value = m.key(), m.value()
    if m.error() is not None or not isinstance(key, bytes) or not isinstance(value, bytes):
        return []
    return [(key, value, m.timestamp()[1])]
