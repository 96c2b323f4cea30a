"""The webhook gateway's Kafka side (``botmesh gateway``, ``botmesh/_gateway.py``): the
idempotent producer of ``<prefix>.inbound`` (acks=all), and ``<prefix>.gateway.seen``, the
compacted topic of the ``(channel, event id)`` pairs produced, read to its end at start and
tailed after (no consumer group), so a webhook the channel retries is produced once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from botmesh.streams.connection import Brokers, aiokafka_options
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
        self.producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._tail: asyncio.Task[None] | None = None
        self.inbound_exists = False

    async def connect(self) -> None:
        """Start the producer, create the seen topic, read it to its end, start the tail.
        Raises on any failure (having closed what it opened)."""
        try:
            # the first contact through the admin client: a refused login or an unknown CA
            # is named (``KafkaAuthError``) rather than aiokafka's bare connection error
            topics = await asyncio.to_thread(self._provision)
            producer = AIOKafkaProducer(
                **aiokafka_options(self.bootstrap),
                acks="all",
                enable_idempotence=True,
                request_timeout_ms=int(max(self.request_timeout, 5.0) * 1000),
                client_id="botmesh-gateway",
            )
            self.producer = producer
            await producer.start()
            self.inbound_exists = self.catalog.inbound in topics
            await self._known(self.catalog.gateway_seen)
            await self._load(topics.get(self.catalog.gateway_seen, 1))
        except BaseException:
            await self.close()
            raise
        self._tail = asyncio.create_task(self._follow(), name="gateway-seen-tail")

    async def _known(self, topic: str, within: float = 15.0) -> None:
        """Wait until the broker's metadata has ``topic`` with its leaders (a topic just
        created takes a moment to show)."""
        assert self.producer is not None
        async with asyncio.timeout(within):
            while True:
                metadata = await self.producer.client.fetch_all_metadata()
                parts = metadata.partitions_for_topic(topic)
                if parts and all(
                    metadata.leader_for_partition(TopicPartition(topic, p)) not in (None, -1)
                    for p in parts
                ):
                    return
                await asyncio.sleep(0.1)

    def _provision(self) -> dict[str, int]:
        specs = self.catalog.gateway_specs(self.replication)
        ensure_topics(self.bootstrap, specs, timeout=10.0)
        return existing_topics(self.bootstrap, timeout=10.0)

    async def _load(self, partitions: int) -> None:
        consumer = AIOKafkaConsumer(
            **aiokafka_options(self.bootstrap),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id="botmesh-gateway-seen",
        )
        self._consumer = consumer
        await consumer.start()
        tps = [TopicPartition(self.catalog.gateway_seen, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        loaded = 0
        while any([await consumer.position(tp) < end[tp] for tp in tps]):
            batch = await consumer.getmany(*tps, timeout_ms=500)
            for records in batch.values():
                for r in records:
                    loaded += self._record(r.key, r.value, r.timestamp)
        log.info("gateway: %d produced events loaded from %s", loaded, self.catalog.gateway_seen)

    def _record(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> int:
        if not key or value is None:
            return 0
        channel, sep, event_id = key.decode("utf-8", "replace").partition(":")
        if not sep:
            return 0
        self._on_seen(channel, event_id, timestamp_ms / 1000.0)
        return 1

    async def _follow(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while True:
            try:
                batch = await consumer.getmany(timeout_ms=1000)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker away: aiokafka reconnects on the next call
                log.warning("gateway: reading %s failed: %s", self.catalog.gateway_seen, exc)
                await asyncio.sleep(1.0)
                continue
            for records in batch.values():
                for r in records:
                    self._record(r.key, r.value, r.timestamp)

    async def send(self, topic: str, key: bytes, value: bytes) -> Awaitable[Any]:
        """Enqueue one record; the result resolves when the broker acked it."""
        return await self.send_with_headers(topic, key, value, None)

    async def send_with_headers(
        self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]] | None
    ) -> Awaitable[Any]:
        """``send`` with the record's headers (a trace's ``traceparent``)."""
        if self.producer is None:
            raise KafkaUnavailable("the producer is not started")
        fut: Awaitable[Any] = await self.producer.send(topic, value, key=key, headers=headers)
        return fut

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
        metadata = await self.producer.client.fetch_all_metadata()
        names: set[str] = set(metadata.topics())
        self.inbound_exists = self.catalog.inbound in names
        return names

    async def close(self) -> None:
        """Flush and stop (idempotent)."""
        if self._tail is not None:
            self._tail.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tail
            self._tail = None
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
        producer, self.producer = self.producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.flush(), self.request_timeout)
            await producer.stop()
